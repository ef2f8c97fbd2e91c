//! The collector processes (`jetstream_collector` example) and nginx balancing across them,
//! each a guard that kills its process when dropped, also on panic.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{example_binary, free_port, signal, wait_exit};

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
    /// Starts one stateless collector on a free port with these flags beside the suite's
    /// own (`--replicas 3`, `--listen`, `--keys`, ...; later ones win); `drop_rate` of its
    /// batches are published, acknowledged and then left unanswered (accept-then-drop).
    pub fn start_with(
        nats_url: &str,
        stream: &str,
        drop_rate: f64,
        seed: u64,
        log: &Path,
        extra: &[&str],
    ) -> Self {
        let log_file = std::fs::File::create(log).expect("collector log file");
        let mut child = Command::new(example_binary("jetstream_collector"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--nats",
                nats_url,
                "--stream",
                stream,
                "--reports-stream",
                &format!("{stream}_REPORTS"),
                "--subject",
                &format!("{}.events", stream.to_lowercase()),
                "--reports-subject",
                &format!("{}.reports", stream.to_lowercase()),
                "--max-bytes",
                "268435456",
            ])
            .args(["--retry-after", "1", "--ack-timeout-ms", "2000"])
            .args(["--drain-announce-ms", "500", "--drain-timeout-ms", "10000"])
            .arg("--until-stdin-closes")
            .args([
                "--drop-rate",
                &drop_rate.to_string(),
                "--seed",
                &seed.to_string(),
            ])
            .args(extra)
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
            .and_then(|a| a.parse::<SocketAddr>().ok())
            // Listening on every address: reach it on loopback.
            .map(|a| SocketAddr::from(([127, 0, 0, 1], a.port())));
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
        let (_, body) = self.get("/stats")?;
        serde_json::from_str(&body).ok()
    }

    /// Status and body of `GET path`, `None` if the process does not answer.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        self.get_with(path, "")
    }

    /// `GET /stats` with `Authorization: Bearer KEY`.
    pub fn stats_with_key(&self, key: &str) -> Option<serde_json::Value> {
        let (_, body) = self.get_with("/stats", &format!("Authorization: Bearer {key}\r\n"))?;
        serde_json::from_str(&body).ok()
    }

    pub fn child(&self) -> &Child {
        &self.child
    }

    fn get_with(&self, path: &str, headers: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\n{headers}Connection: close\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    /// SIGTERM: the collector drains (readiness fails, the socket closes after 500 ms,
    /// requests in flight finish); returns its exit code once it is gone, bounded.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        signal(&self.child, "TERM");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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

/// nginx in front of the collectors as docs/scale.md configures it: round
/// robin; a connect error (a killed or drained collector refuses) is retried on the next
/// collector; a request already sent is never re-sent by nginx (POST), the client does that;
/// and no collector is ever benched for failed requests (`max_fails=0`): an answer dropped
/// after the batch was stored is the request's failure, not the collector's, and benching on
/// it emptied the pool ("no live upstreams"). Which collectors take traffic is the health
/// check's business (`/readyz`), which open-source nginx cannot do actively; a collector that
/// stops being ready because it drains closes its socket, which nginx skips.
pub struct LoadBalancer {
    child: Child,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
}

impl LoadBalancer {
    pub fn start(upstreams: &[SocketAddr]) -> LoadBalancer {
        let binary = eventspool_testkit::nginx::binary();
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

    /// Requests answered, by status.
    pub fn answered(&self) -> std::collections::BTreeMap<String, u64> {
        let mut by = std::collections::BTreeMap::new();
        for line in self.log_lines() {
            *by.entry(line.status.to_string()).or_insert(0) += 1;
        }
        by
    }

    /// Every access log line, in order.
    pub fn log_lines(&self) -> Vec<AccessLine> {
        let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let mut w = line.split_whitespace();
                Some(AccessLine {
                    status: w.next()?.parse().ok()?,
                    at: w.next()?.parse().ok()?,
                    seconds: w.next()?.parse().ok()?,
                    retry_after: w.next().is_some_and(|v| v != "-"),
                })
            })
            .collect()
    }
}

/// One request as nginx logged it.
pub struct AccessLine {
    pub status: u16,
    /// When the answer went (seconds since the epoch, ms precision).
    pub at: f64,
    /// How long the request took at nginx.
    pub seconds: f64,
    /// Whether the answer carried Retry-After.
    pub retry_after: bool,
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
        .map(|u| format!("        server {u} max_fails=0;\n"))
        .collect();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format statuses '$status $msec $request_time $sent_http_retry_after $upstream_addr';
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
            # Connect errors and connect timeouts only: nginx never re-sends a POST it sent.
            proxy_next_upstream error timeout;
            proxy_connect_timeout 1s;
            proxy_read_timeout 30s;
        }}
    }}
}}
"#
    )
}
