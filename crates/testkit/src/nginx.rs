//! A real nginx (Debian's package) run by the test: its own prefix, config, logs and temp
//! paths in a temp dir, listening on a free loopback port, killed when the guard drops.
//!
//! One nginx per scenario, each with its own config: after `nginx -s reload` the old worker
//! answers with the old config for a while (FACTS.md), which would make assertions racy.
//! `master_process off` keeps it one process: nothing to orphan when the test kills it, and no
//! switch to the `user` directive's account, so it runs the same as root or as anyone.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Start-up (bind, config check) takes milliseconds; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// nginx writes the access log line right after the answer; this bounds the wait for it.
const LOG_TIMEOUT: Duration = Duration::from_secs(10);
const START_TRIES: usize = 3;

/// Where Debian's package puts the binary, in case `sbin` is not on a user's PATH.
const KNOWN_PATHS: [&str; 3] = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"];

/// The nginx binary (`NGINX`, else PATH, else Debian's paths), or a failure saying why there
/// is none. The suite fails without nginx
/// rather than skip: a proxy test that silently did not run proves nothing.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NGINX").map(PathBuf::from) {
        assert!(
            path.is_file(),
            "NGINX={} is not a file: the proxy suite needs nginx",
            path.display()
        );
        return path;
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nginx"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(KNOWN_PATHS.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nginx is not installed (not on PATH nor in {KNOWN_PATHS:?}, NGINX unset): \
                 the proxy suite needs it; install it with `apt-get install -y nginx` \
                 (bash .ci/run does)"
            )
        })
}

/// What nginx signs its error pages with, `nginx/1.22.1`, from `nginx -v`.
pub fn version_tag() -> String {
    let out = Command::new(binary())
        .arg("-v")
        .output()
        .expect("run nginx -v");
    // "nginx version: nginx/1.22.1" (on stderr), perhaps with a distribution suffix.
    let text = String::from_utf8_lossy(&out.stderr);
    text.split_whitespace()
        .find(|w| w.starts_with("nginx/"))
        .unwrap_or_else(|| panic!("unexpected `nginx -v`: {text}"))
        .to_string()
}

/// The pieces of config a scenario adds around a plain `proxy_pass` to the upstream.
#[derive(Default)]
pub struct Site<'a> {
    /// Inside `http { }`, e.g. `limit_req_zone`.
    pub http: &'a str,
    /// Inside `server { }`, e.g. `client_max_body_size 16k;`.
    pub server: &'a str,
    /// `location` blocks beyond the default `location /`, each proxying like it does.
    pub locations: &'a [(&'a str, &'a str)],
    /// Inside the default `location / { }`, e.g. `proxy_read_timeout 300ms;`.
    pub location: &'a str,
}

pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
}

impl Nginx {
    /// Starts nginx proxying every location to `upstream` (host:port) and waits until it
    /// accepts connections.
    pub fn start(upstream: SocketAddr, site: &Site) -> Nginx {
        let binary = binary();
        let mut last_error = String::new();
        for _ in 0..START_TRIES {
            let dir = tempfile::tempdir().expect("temp dir for nginx");
            let port = free_port();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            std::fs::write(
                dir.path().join("nginx.conf"),
                config(dir.path(), addr, upstream, site),
            )
            .expect("write nginx.conf");
            let child = Command::new(&binary)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg("nginx.conf")
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
            let mut nginx = Nginx { child, dir, addr };
            match nginx.wait_ready() {
                Ok(()) => return nginx,
                // Another process took the port between the probe and nginx's bind: try again.
                Err(log) if log.contains("Address already in use") => last_error = log,
                Err(log) => panic!("nginx did not start:\n{log}"),
            }
        }
        panic!("nginx could not bind a free port in {START_TRIES} tries:\n{last_error}");
    }

    /// `Err(error log)` if nginx exited or never listened.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for nginx") {
                return Err(format!("nginx exited ({status}):\n{}", self.error_log()));
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not listening after {START_TIMEOUT:?}:\n{}",
                    self.error_log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// One `(status, uri)` per request nginx answered, in order; waits (bounded) until there
    /// are at least `at_least`, since the line is written just after the answer is sent.
    pub fn access_log(&self, at_least: u64) -> Vec<(u16, String)> {
        let deadline = Instant::now() + LOG_TIMEOUT;
        loop {
            let text =
                std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
            let lines: Vec<(u16, String)> = text
                .lines()
                .filter_map(|l| {
                    let (status, uri) = l.split_once(' ')?;
                    Some((status.parse().ok()?, uri.to_string()))
                })
                .collect();
            if lines.len() as u64 >= at_least || Instant::now() >= deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Requests answered, by status.
    pub fn statuses(&self, at_least: u64) -> BTreeMap<u16, u64> {
        let mut by_status = BTreeMap::new();
        for (status, _) in self.access_log(at_least) {
            *by_status.entry(status).or_insert(0) += 1;
        }
        by_status
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago (the OS picks it; nginx binds it right after).
fn free_port() -> u16 {
    let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    probe.local_addr().expect("probe address").port()
}

fn config(dir: &Path, listen: SocketAddr, upstream: SocketAddr, site: &Site) -> String {
    let d = dir.display();
    let proxy = format!(
        "proxy_pass http://{upstream};\n            proxy_http_version 1.1;\n            \
         proxy_set_header Connection \"\";"
    );
    let mut locations = String::new();
    for (path, extra) in site.locations {
        locations.push_str(&format!(
            "        location {path} {{\n            {proxy}\n            {extra}\n        }}\n"
        ));
    }
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 128; }}
http {{
    log_format statuses '$status $request_uri';
    access_log {d}/access.log statuses;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    {http}
    server {{
        listen {listen};
        server_tokens on;
        {server}
{locations}        location / {{
            {proxy}
            {location}
        }}
    }}
}}
"#,
        http = site.http,
        server = site.server,
        location = site.location,
    )
}
