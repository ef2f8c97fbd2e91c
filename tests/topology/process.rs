//! Small process helpers shared by the guards: free ports, signals, bounded waits, and the
//! example binaries.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Where `free_port` looks: below Linux's ephemeral range (32768 and up by default), from which
/// every outgoing connection and every port-0 listener takes its port. A port the OS handed out
/// for a probe could be taken by one of the suite's hundreds of client connections between the
/// probe and the server's bind ("address already in use" for a cluster route); one from here
/// cannot.
const PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A port that was free a moment ago (the server binds it right after); never one of the OS's
/// ephemeral ports, and never the same twice in one test process.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = PORTS.end - PORTS.start;
    // Runs of the suite side by side start at different places.
    let offset = std::process::id() * 97;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (PORTS.start + (offset + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {PORTS:?} on 127.0.0.1");
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
