//! Child processes owned by a test: killed (and reaped) when the guard drops, so a failing
//! assertion never leaves Envoy or a service running. Output goes to a log file whose tail is
//! printed when a process dies early, which is what one needs to debug a failed start. The
//! log is removed with the guard, unless the test is failing: then it stays, and its path is
//! printed.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `program args..`, stdout and stderr appended to a fresh log file.
    pub fn spawn(name: &str, program: &Path, args: &[String]) -> Result<Proc> {
        Proc::spawn_env(name, program, args, &[])
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_env(name: &str, program: &Path, args: &[String], env: &[(&str, &str)]) -> Result<Proc> {
        let log = std::env::temp_dir().join(format!("kvroute-e2e-{}-{}-{}.log", name, std::process::id(), unique()));
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("starting {name}: {}", program.display()))?;
        Ok(Proc { name: name.to_string(), child: Some(child), log })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fails with the log tail if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("{} exited ({status}); log tail:\n{}", self.name, self.log_tail(4000));
            }
        }
        Ok(())
    }

    pub fn log_tail(&self, bytes: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(bytes);
        let start = (start..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
        text[start..].to_string()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process now (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("{} log kept: {}", self.name, self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
