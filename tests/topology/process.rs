//! Small process helpers shared by the guards: free ports, signals, bounded waits, and the
//! example binaries.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A port that was free a moment ago (the OS picks it; the server binds it right after).
pub fn free_port() -> u16 {
    let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    probe.local_addr().expect("probe address").port()
}

/// Sends `SIG<name>` with the system's `kill`, which keeps the suite free of libc bindings.
pub fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status();
}

/// Waits for the process to exit; SIGKILLs it past `timeout` so a test never hangs here.
pub fn wait_exit(child: &mut Child, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// An example binary of this package (`jetstream_collector`, `stream_to_warehouse`), built on
/// demand when the suite runs alone.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = profile_dir.join("examples").join(name);
    if !bin.exists() {
        let release = profile_dir.ends_with("release");
        let status = Command::new(env!("CARGO"))
            .args(["build", "--all-features", "--example", name])
            .args(release.then_some("--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build");
        assert!(status.success(), "building {name} failed");
    }
    bin
}
