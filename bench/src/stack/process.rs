//! A child process that cannot outlive the benchmark: own process group (so signals reach
//! everything it forks, and a terminal Ctrl-C is handled by us, in order), parent-death
//! signal, SIGTERM then SIGKILL on stop/drop. Output goes to `<work_dir>/<name>.log`.

use crate::BenchError;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct Managed {
    pub name: String,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Managed {
    /// Starts `bin args..` in its own process group with `env` added to its environment (how
    /// credentials reach it: never argv, never a config file).
    pub fn spawn(name: &str, bin: &Path, args: &[String], work_dir: &Path, env: &[(&str, &str)]) -> Result<Managed, BenchError> {
        let log = work_dir.join(format!("{name}.log"));
        let io = |e: std::io::Error, p: &Path| BenchError::Io { path: p.to_path_buf(), source: e };
        let out = std::fs::File::create(&log).map_err(|e| io(e, &log))?;
        let err = out.try_clone().map_err(|e| io(e, &log))?;
        let mut cmd = Command::new(bin);
        cmd.args(args).envs(env.iter().copied()).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| io(e, bin))?;
        Ok(Managed { name: name.to_string(), log, child: Some(child) })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to the child's process group (SIGSTOP / SIGCONT for a frozen process).
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: signalling our own child's process group, by its id.
            unsafe { libc::kill(-(child.id() as libc::pid_t), signal) };
        }
    }

    /// SIGKILLs the group at once (a crash, not a shutdown) and reaps the child.
    pub fn kill_now(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // SAFETY: as in `signal`.
        unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = child.wait();
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM the group, wait up to 5 s, then SIGKILL it; reaps the child.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let pgid = child.id() as libc::pid_t;
        if child.try_wait().ok().flatten().is_none() {
            // SAFETY: signalling our own child's process group, by its id.
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Whatever is left in the group (the child or anything it forked) gets SIGKILL.
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = child.wait();
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exists and is not a zombie (an orphan may wait a moment for its new parent to reap it).
    fn alive(pid: libc::pid_t) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        matches!(state, Some(c) if c != 'Z' && c != 'X')
    }

    #[test]
    fn stop_kills_the_whole_group() {
        let dir = std::env::temp_dir().join(format!("kvroute-bench-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A shell that forks a grandchild and waits: both must be gone after stop().
        let pid_file = dir.join("grandchild.pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
        let mut m = Managed::spawn("sh", Path::new("/bin/sh"), &["-c".to_string(), script], &dir, &[]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pid_file.exists() || std::fs::read_to_string(&pid_file).unwrap().trim().is_empty() {
            assert!(Instant::now() < deadline, "grandchild never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        let grandchild: libc::pid_t = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        assert!(m.exited().is_none());
        m.stop();
        // The grandchild is not our child, so it is reaped by init; wait for it to vanish.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(grandchild) {
            assert!(Instant::now() < deadline, "grandchild survived");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
