//! The collector processes (`jetstream_collector` example) and nginx balancing across them,
//! each a guard that kills its process when dropped, also on panic.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{example_binary, free_port, wait_exit};

#[path = "../../crates/cli/tests/proxy/nginx.rs"]
#[allow(dead_code)]
mod proxy_nginx;

/// Start-up includes connecting to the broker and looking up the stream.
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct CollectorProcess {
    child: Child,
    /// Held open: the process serves until its stdin closes.
    _stdin: ChildStdin,
    pub addr: SocketAddr,
    log: PathBuf,
}

impl CollectorProcess {
    /// Starts one stateless collector on a free port; `drop_rate` of its batches are
    /// published, acknowledged and then left unanswered (accept-then-drop).
    pub fn start(nats_url: &str, stream: &str, drop_rate: f64, seed: u64, log: &Path) -> Self {
        let log_file = std::fs::File::create(log).expect("collector log file");
        let mut child = Command::new(example_binary("jetstream_collector"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--nats",
                nats_url,
                "--stream",
                stream,
            ])
            .args(["--retry-after", "1", "--ack-timeout-ms", "2000"])
            .args([
                "--drop-rate",
                &drop_rate.to_string(),
                "--seed",
                &seed.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .expect("run jetstream_collector");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        // The first line is the URL; reading it on a thread keeps the wait bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_TIMEOUT).unwrap_or_default();
        let addr = line
            .trim()
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "jetstream_collector did not start (first line {line:?}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        };
        CollectorProcess {
            child,
            _stdin: stdin,
            addr,
            log: log.to_path_buf(),
        }
    }

    /// SIGKILL, whatever it is doing; returns once the process is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        wait_exit(&mut self.child, Duration::from_secs(10));
    }

    /// `GET /stats` of the process, `None` if it does not answer.
    pub fn stats(&self) -> Option<serde_json::Value> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET /stats HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
    }

    /// Sum of `field=N` over the process's "acknowledged" log lines (one per batch JetStream
    /// acknowledged): readable after a SIGKILL too, up to the last line it wrote.
    pub fn acked(&self, field: &str) -> u64 {
        let prefix = format!("{field}=");
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("acknowledged"))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|w| w.strip_prefix(&prefix)?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for CollectorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx in front of the collectors: round robin, an upstream that refuses connections is
/// skipped (after 3 failures it is benched for 2 s), a request already sent is never re-sent by nginx (POST):
/// the client does that, through whichever collector nginx picks next.
pub struct LoadBalancer {
    child: Child,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
}

impl LoadBalancer {
    pub fn start(upstreams: &[SocketAddr]) -> LoadBalancer {
        let binary = proxy_nginx::binary();
        let dir = tempfile::tempdir().expect("temp dir for nginx");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        std::fs::write(
            dir.path().join("nginx.conf"),
            config(dir.path(), addr, upstreams),
        )
        .expect("write nginx.conf");
        let child = Command::new(&binary)
            .arg("-p")
            .arg(dir.path())
            .args(["-c", "nginx.conf", "-e"])
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
        let mut lb = LoadBalancer { child, dir, addr };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = lb.child.try_wait() {
                panic!("nginx exited ({status}):\n{}", lb.error_log());
            }
            if TcpStream::connect_timeout(&lb.addr, Duration::from_millis(200)).is_ok() {
                return lb;
            }
            assert!(
                Instant::now() < deadline,
                "nginx not listening:\n{}",
                lb.error_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/v1/batch", self.addr)
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// Requests answered, by status and by upstream (`$upstream_addr`, which lists every
    /// collector tried for one request).
    pub fn answered(&self) -> std::collections::BTreeMap<String, u64> {
        let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        let mut by = std::collections::BTreeMap::new();
        for line in text.lines() {
            let status = line.split_whitespace().next().unwrap_or("?");
            *by.entry(status.to_owned()).or_insert(0) += 1;
        }
        by
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(dir: &Path, listen: SocketAddr, upstreams: &[SocketAddr]) -> String {
    let d = dir.display();
    let servers: String = upstreams
        .iter()
        .map(|u| format!("        server {u} max_fails=3 fail_timeout=2s;\n"))
        .collect();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format statuses '$status $upstream_addr';
    access_log {d}/access.log statuses;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream collectors {{
{servers}        keepalive 32;
    }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://collectors;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout;
            proxy_connect_timeout 1s;
            proxy_read_timeout 30s;
        }}
    }}
}}
"#
    )
}
