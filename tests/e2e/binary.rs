//! The real `outbox-host` binary: start it on a test's config, signal it, wait for it.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::support::{PATIENCE, World};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_outbox-host");

/// Writes `yaml` as the world's config file and returns its path.
pub fn write_config(world: &World, yaml: &str) -> std::path::PathBuf {
    let config = world.dir.path().join("outbox.yaml");
    std::fs::write(&config, yaml).unwrap();
    config
}

/// `outbox-host --config <yaml> run`, stdout discarded, stderr piped.
pub fn spawn_host(world: &World, yaml: &str) -> HostProcess {
    spawn(world, yaml, &[], &[])
}

/// [`spawn_host`] with extra environment variables.
pub fn spawn_with(world: &World, yaml: &str, env: &[(&str, &str)]) -> HostProcess {
    spawn(world, yaml, &[], env)
}

/// `outbox-host --config <yaml> <flags> run` with extra environment variables.
pub fn spawn(world: &World, yaml: &str, flags: &[&str], env: &[(&str, &str)]) -> HostProcess {
    spawn_on(&write_config(world, yaml), flags, env)
}

/// [`spawn`] on a config file already written: several hosts started at once on one file
/// (writing it again for each could let one read it half written).
pub fn spawn_on(config: &std::path::Path, flags: &[&str], env: &[(&str, &str)]) -> HostProcess {
    Command::new(BIN)
        .args(["--config", config.to_str().unwrap()])
        .args(flags)
        .arg("run")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map(HostProcess::new)
        .expect("starting outbox-host")
}

/// A host process a test started: killed when dropped while still running, so that a test
/// that fails or times out leaves no host behind.
pub struct HostProcess(Option<Child>);

impl HostProcess {
    /// Owns `child` from now on.
    pub fn new(child: Child) -> HostProcess {
        HostProcess(Some(child))
    }

    /// The process, no longer killed on drop (its waiter owns it).
    fn into_child(mut self) -> Child {
        self.0.take().expect("present until taken")
    }
}

impl std::ops::Deref for HostProcess {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("present until taken")
    }
}

impl std::ops::DerefMut for HostProcess {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("present until taken")
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut()
            && child.try_wait().ok().flatten().is_none()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs one command of the binary on the world's config file to its end.
pub fn run_cli(world: &World, args: &[&str]) -> Output {
    let config = world.dir.path().join("outbox.yaml");
    Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running outbox-host")
}

/// [`run_cli`] off the test's runtime, so that a host running in this test keeps going
/// meanwhile (a frozen host could hold SQLite's write lock the command waits for).
pub async fn run_cli_beside(world: &World, args: &[&str]) -> Output {
    let config = world.dir.path().join("outbox.yaml");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(BIN).arg("--config").arg(&config).args(&args).stdin(Stdio::null()).output()
    })
    .await
    .unwrap()
    .expect("running outbox-host")
}

/// Sends `kill -<name>` to the child.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Polls the table (another process's progress has no in-process signal) until `check`.
pub async fn wait_table(world: &World, what: &str, check: impl Fn(&outbox_host::store::Stats) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if check(&world.producer.stats().await.unwrap()) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for the child to exit and collects what it wrote.
pub async fn wait_exit(child: HostProcess) -> Output {
    wait_exit_within(child, PATIENCE).await
}

/// [`wait_exit`] with a patience of its own.
pub async fn wait_exit_within(mut child: HostProcess, patience: Duration) -> Output {
    let deadline = std::time::Instant::now() + patience;
    while child.try_wait().unwrap().is_none() {
        // Past the deadline the panic drops `child`, which kills it.
        assert!(std::time::Instant::now() < deadline, "outbox-host did not exit within {patience:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.into_child().wait_with_output().unwrap()
}

/// A loopback port that was free a moment ago, for an admin listener of the binary.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
