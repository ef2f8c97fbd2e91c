//! A slow uplink in user space (the kernel here has no `netem`/`tbf`): a TCP proxy on 127.0.0.1
//! in front of a real server that lets the request direction through at `bytes_per_sec`, each
//! chunk arriving `latency` after it was serialised, and the answer direction back after
//! `latency`. Its listening socket has a small receive buffer, so what the client has written
//! sits in the client's own buffers until the link takes it, as on a real slow link whose
//! bottleneck queue holds about one round trip of data.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The link's serialisation step: at most this many bytes are taken from the client at once.
const STEP_BYTES: usize = 512;
/// How late past its last step the link may take the next one and still count as busy.
const IDLE_SLACK: Duration = Duration::from_millis(5);

#[derive(Clone, Copy, Debug)]
pub struct Link {
    pub bytes_per_sec: u64,
    pub latency: Duration,
}

/// The proxy; it stops (and drops every connection) when dropped.
pub struct Throttle {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Throttle {
    /// Starts the proxy in front of `upstream` (the server's `host:port`).
    pub fn start(upstream: SocketAddr, link: Link) -> std::io::Result<Throttle> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(async {
            let socket = TcpSocket::new_v4()?;
            // Inherited by every accepted connection: the link, not the proxy, holds the bytes.
            socket.set_recv_buffer_size(4096)?;
            socket.bind("127.0.0.1:0".parse().unwrap())?;
            socket.listen(16)
        })?;
        let addr = listener.local_addr()?;
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::spawn(pipe(client_read, server_write, link));
                    tokio::spawn(pipe(
                        server_read,
                        client_write,
                        Link {
                            bytes_per_sec: 0,
                            latency: link.latency,
                        },
                    ));
                });
            }
        });
        Ok(Throttle {
            addr,
            runtime: Some(runtime),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// One direction: reads at most [`STEP_BYTES`] at a time, waits as long as the link needs to
/// serialise them (`bytes_per_sec` 0: no limit), and hands them to a writer that delivers each
/// chunk `latency` after it was serialised. Ends when either side closes.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Link,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; STEP_BYTES];
    let mut free_at = Instant::now();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if link.bytes_per_sec > 0 {
            let busy = Duration::from_secs_f64(n as f64 / link.bytes_per_sec as f64);
            // A timer wakes late by up to a millisecond or so: a link that was busy all along
            // carries on from where its last step ended, so the oversleep is not lost from its
            // rate; one that sat idle starts now.
            let now = Instant::now();
            let start = if now <= free_at + IDLE_SLACK {
                free_at
            } else {
                now
            };
            free_at = start + busy;
            tokio::time::sleep_until(free_at).await;
        }
        if tx
            .send((Instant::now() + link.latency, buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}
