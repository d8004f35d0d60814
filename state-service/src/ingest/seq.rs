//! Sequence tracking for one engine's live stream, as a pure state machine.
//!
//! vLLM numbers batches 0, 1, 2, ... per engine process. A jump forward means we missed
//! batches (ZMQ drops on a slow or reconnecting subscriber): ask the replay socket. A jump
//! backwards means the engine process restarted with an empty cache: forget the engine.
//! Joining a stream mid-way (the first message seen is not seq 0) means the engine already
//! holds blocks we never heard of: catch up from everything its replay buffer still keeps.

/// What to do with a live message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SeqAction {
    /// In order (or seq 0 as the first message seen): apply.
    Apply,
    /// The first message seen has `seq > 0`: replay `0..seq` (what vLLM still buffers), then
    /// apply this one. Not a gap: nothing was lost, we joined late.
    CatchUp,
    /// Batches `from..seq` are missing: replay them, then apply this one.
    Gap { from: u64 },
    /// The engine restarted: clear its blocks, then apply.
    Reset,
    /// Same sequence number as the last one: already applied.
    Duplicate,
}

#[derive(Default)]
pub(crate) struct SeqTracker {
    last: Option<u64>,
    /// Warm start: live batches up to here were already applied from a replay (they were
    /// queued on the subscription meanwhile), so they are duplicates, not a restart.
    replayed_through: Option<u64>,
}

impl SeqTracker {
    /// Starts from a known position: `last` was applied; with `replayed`, live seqs up to
    /// `last` are duplicates until a higher one arrives.
    pub(crate) fn resume(&mut self, last: u64, replayed: bool) {
        self.last = Some(last);
        self.replayed_through = replayed.then_some(last);
    }

    /// The seq expected next: 0 before any.
    pub(crate) fn next(&self) -> u64 {
        self.last.map_or(0, |l| l + 1)
    }

    /// Classifies `seq` and records it as the last one.
    pub(crate) fn observe(&mut self, seq: u64) -> SeqAction {
        if let Some(through) = self.replayed_through {
            if seq <= through {
                return SeqAction::Duplicate;
            }
            self.replayed_through = None;
        }
        let action = match self.last {
            None if seq == 0 => SeqAction::Apply,
            None => SeqAction::CatchUp,
            Some(last) if seq == last => SeqAction::Duplicate,
            Some(last) if seq < last => SeqAction::Reset,
            Some(last) if seq == last + 1 => SeqAction::Apply,
            Some(last) => SeqAction::Gap { from: last + 1 },
        };
        self.last = Some(seq);
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_every_case() {
        let mut t = SeqTracker::default();
        assert_eq!(t.observe(5), SeqAction::CatchUp, "joined mid-stream: replay what came before");
        assert_eq!(t.observe(6), SeqAction::Apply);
        assert_eq!(t.observe(6), SeqAction::Duplicate);
        assert_eq!(t.observe(9), SeqAction::Gap { from: 7 });
        assert_eq!(t.observe(10), SeqAction::Apply);
        assert_eq!(t.observe(0), SeqAction::Reset);
        assert_eq!(t.observe(1), SeqAction::Apply);
        assert_eq!(t.observe(u64::MAX - 1), SeqAction::Gap { from: 2 });
    }

    #[test]
    fn a_stream_seen_from_its_start_needs_no_catch_up() {
        let mut t = SeqTracker::default();
        assert_eq!(t.observe(0), SeqAction::Apply);
        assert_eq!(t.observe(1), SeqAction::Apply);
    }

    #[test]
    fn resumes_from_a_mirror() {
        let mut t = SeqTracker::default();
        t.resume(10, true);
        assert_eq!(t.observe(8), SeqAction::Duplicate, "queued while replaying");
        assert_eq!(t.observe(10), SeqAction::Duplicate);
        assert_eq!(t.observe(11), SeqAction::Apply);
        assert_eq!(t.observe(3), SeqAction::Reset, "the floor is gone once passed");
        let mut t = SeqTracker::default();
        t.resume(10, false);
        assert_eq!(t.observe(11), SeqAction::Apply);
        let mut t = SeqTracker::default();
        t.resume(10, false);
        assert_eq!(t.observe(2), SeqAction::Reset, "nothing replayed and a lower seq: restarted");
    }
}
