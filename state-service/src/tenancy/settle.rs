//! What a finished request is charged: every token the engine computed for it, whoever ended
//! it and however. The reservation admission made is replaced by this when the proxy reports
//! the end (see [`super::Tenants::settle`]).

/// How a request ended, as the proxy reported it (also carried between replicas, when the
/// replica that heard the report does not hold the pick).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Ending {
    /// Completed (the response's end reached the proxy) rather than cancelled.
    pub completed: bool,
    /// The upstream response's HTTP status (0: none came).
    pub status: u32,
    /// The response's usage (0: not reported).
    pub prompt_tokens: u32,
    pub cached_tokens: Option<u32>,
    /// From the usage, else the tokens the proxy saw streamed.
    pub completion_tokens: u32,
    /// A cancel of a request the proxy had forwarded to a worker.
    pub forwarded: bool,
    /// The response was a stream (the proxy counted what it streamed).
    pub streaming: bool,
}

/// What the request cost: uncached prompt tokens plus generated tokens.
///
/// - An engine that refused the request (a 4xx) did no work: 0.
/// - A cancel of a pick the proxy never forwarded: it reached no worker, 0.
/// - A cancel after forwarding (the client left): a stream is charged its prefill and what it
///   streamed (vLLM aborts a request when its client disconnects, after the step in
///   progress); a non-streamed request, whose output never reached the proxy, is charged what
///   it was admitted for (`reserved`): what the engine did for it is not known here, and at
///   least its prefill was done.
/// - A completion: the usage's uncached prompt tokens (the prediction when the usage had no
///   prompt count) plus its output.
pub fn settled_tokens(end: &Ending, predicted_uncached: u32, reserved: u64) -> u64 {
    if (400..500).contains(&end.status) {
        return 0;
    }
    if !end.completed {
        return match (end.forwarded, end.streaming) {
            (false, _) => 0,
            (true, true) => u64::from(predicted_uncached) + u64::from(end.completion_tokens),
            (true, false) => reserved.max(u64::from(predicted_uncached)),
        };
    }
    let uncached = match (end.prompt_tokens, end.cached_tokens) {
        (0, _) => predicted_uncached,
        (p, Some(c)) => p.saturating_sub(c),
        (p, None) => predicted_uncached.min(p),
    };
    u64::from(uncached) + u64::from(end.completion_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ending_is_charged_what_the_engine_did() {
        let done = Ending { completed: true, status: 200, prompt_tokens: 100, cached_tokens: Some(60), completion_tokens: 7, ..Ending::default() };
        assert_eq!(settled_tokens(&done, 90, 500), 47, "the usage's uncached prompt and output");
        let no_usage = Ending { prompt_tokens: 0, cached_tokens: None, ..done };
        assert_eq!(settled_tokens(&no_usage, 90, 500), 97, "the predicted prefill when the usage has no prompt");
        let refused = Ending { status: 400, ..done };
        assert_eq!(settled_tokens(&refused, 90, 500), 0, "the engine refused it");
        let never_sent = Ending { completed: false, ..Ending::default() };
        assert_eq!(settled_tokens(&never_sent, 90, 500), 0);
        let left_stream = Ending { completed: false, forwarded: true, streaming: true, completion_tokens: 12, status: 200, ..Ending::default() };
        assert_eq!(settled_tokens(&left_stream, 90, 500), 102, "prefill and what was streamed");
        let left_waiting = Ending { completed: false, forwarded: true, ..Ending::default() };
        assert_eq!(settled_tokens(&left_waiting, 90, 500), 500, "a non-streamed request left before its only byte: what it was admitted for");
        assert_eq!(settled_tokens(&left_waiting, 90, 0), 90, "at least its prefill");
    }
}
