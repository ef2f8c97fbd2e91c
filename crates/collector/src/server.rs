//! The server thread: its runtime, the accept loop, and the control loop that takes the
//! socket down and up again for outages, and drains it for an orderly stop.
//!
//! Commands travel on a tokio channel (sendable from any thread without blocking) and are
//! acknowledged on a std channel, so the synchronous handle can wait for "the port is really
//! closed" before returning, which is what makes outage tests deterministic.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::{self as std_mpsc, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::state::Shared;
use super::{CONTROL_TIMEOUT, SHUTDOWN_TIMEOUT, handler};

const LOG_TARGET: &str = "eventspool::collector";
/// Enough for bursts of parallel connects in benchmarks.
const LISTEN_BACKLOG: u32 = 1024;
/// Pause after a failed accept (e.g. out of file descriptors) so the loop cannot spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// How long a connection past `max_connections` gets to take its 503.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

enum Command {
    Outage {
        down: bool,
        ack: std_mpsc::SyncSender<io::Result<()>>,
    },
    /// Close the listener, let every connection finish its request, bounded; acknowledges
    /// with the number of connections still busy at the bound (cut).
    Drain {
        timeout: Duration,
        ack: std_mpsc::SyncSender<usize>,
    },
    Shutdown,
}

/// How the accept loop is told to end.
enum Stop {
    /// At once: every connection is cut (outage, shutdown).
    Now,
    /// After every connection answered its request, or at the bound.
    Graceful(Duration),
}

/// The handle's side of the server thread.
pub(super) struct ServerThread {
    commands: mpsc::UnboundedSender<Command>,
    /// Never sent on; it disconnects when the thread's closure returns, which gives
    /// shutdown a join with a timeout.
    exited: std_mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "collector is not running")
}

/// Binds with SO_REUSEADDR so the same port can be bound again right after an outage,
/// while the server side's closed connections still sit in TIME_WAIT.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

pub(super) fn spawn(
    listen: SocketAddr,
    shared: Arc<Shared>,
) -> io::Result<(ServerThread, SocketAddr)> {
    let (ready_tx, ready_rx) = std_mpsc::sync_channel::<io::Result<SocketAddr>>(1);
    let (exited_tx, exited_rx) = std_mpsc::sync_channel::<()>(1);
    let (commands, command_rx) = mpsc::unbounded_channel();
    let thread = std::thread::Builder::new()
        .name("eventspool-collector".into())
        .spawn(move || {
            let _exited = exited_tx;
            run(listen, shared, command_rx, ready_tx);
        })?;
    let addr = match ready_rx.recv() {
        Ok(Ok(addr)) => addr,
        Ok(Err(e)) => {
            let _ = thread.join();
            return Err(e);
        }
        Err(_) => {
            let _ = thread.join();
            return Err(io::Error::other("collector thread ended while starting"));
        }
    };
    let handle = ServerThread {
        commands,
        exited: exited_rx,
        thread: Some(thread),
    };
    Ok((handle, addr))
}

fn run(
    listen: SocketAddr,
    shared: Arc<Shared>,
    commands: mpsc::UnboundedReceiver<Command>,
    ready: std_mpsc::SyncSender<io::Result<SocketAddr>>,
) {
    // Several workers for a service: one busy connection must not hold up the others, and an
    // overloaded collector must still be able to answer 503 quickly (large bodies are decoded
    // on the blocking pool in both cases).
    let workers = shared.limits().workers;
    let built = if workers > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("eventspool-collector-worker")
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.try_send(Err(e));
            return;
        }
    };
    runtime.block_on(async move {
        // Bound inside the runtime: a tokio listener registers with this runtime's reactor.
        let listener = match bind(listen).and_then(|l| Ok((l.local_addr()?, l))) {
            Ok((addr, listener)) => {
                let _ = ready.try_send(Ok(addr));
                (addr, listener)
            }
            Err(e) => {
                let _ = ready.try_send(Err(e));
                return;
            }
        };
        control(listener.0, listener.1, shared, commands).await;
    });
    // Dropping the runtime here, on this thread, cancels whatever is left (hung requests).
}

/// A running accept loop and the way to stop it.
struct Serving {
    stop: oneshot::Sender<Stop>,
    task: tokio::task::JoinHandle<usize>,
}

impl Serving {
    fn start(listener: TcpListener, shared: Arc<Shared>) -> Serving {
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, shared, stop_rx));
        Serving { stop, task }
    }

    /// Returns once the listener and every connection are closed.
    async fn stop(self) {
        let _ = self.stop.send(Stop::Now);
        let _ = self.task.await;
    }

    /// Returns once every connection finished, or at `timeout` with the number still busy.
    async fn drain(self, timeout: Duration) -> usize {
        let _ = self.stop.send(Stop::Graceful(timeout));
        self.task.await.unwrap_or(0)
    }
}

async fn control(
    addr: SocketAddr,
    listener: TcpListener,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut serving = Some(Serving::start(listener, Arc::clone(&shared)));
    // `None` means every handle is gone: stop as for Shutdown.
    while let Some(command) = commands.recv().await {
        match command {
            Command::Outage { down: true, ack } => {
                if let Some(s) = serving.take() {
                    s.stop().await;
                    tracing::info!(target: LOG_TARGET, %addr, "outage: socket closed");
                }
                let _ = ack.try_send(Ok(()));
            }
            Command::Outage { down: false, ack } => {
                let result = if serving.is_some() {
                    Ok(())
                } else {
                    bind(addr).map(|l| {
                        serving = Some(Serving::start(l, Arc::clone(&shared)));
                        tracing::info!(target: LOG_TARGET, %addr, "outage over: listening again");
                    })
                };
                let _ = ack.try_send(result);
            }
            Command::Drain { timeout, ack } => {
                let cut = match serving.take() {
                    Some(s) => s.drain(timeout).await,
                    None => 0,
                };
                tracing::info!(target: LOG_TARGET, %addr, cut, "drained");
                let _ = ack.try_send(cut);
            }
            Command::Shutdown => break,
        }
    }
    if let Some(s) = serving.take() {
        s.stop().await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<Stop>,
) -> usize {
    let mut connections = JoinSet::new();
    let mut refusals = JoinSet::new();
    let graceful = GracefulShutdown::new();
    let limits = shared.limits().clone();
    let how = loop {
        tokio::select! {
            how = &mut stop => break how.unwrap_or(Stop::Now),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if connections.len() >= limits.max_connections {
                        shared.metrics().shed("connections");
                        if refusals.len() < limits.max_connections {
                            refusals.spawn(refuse(stream, limits.retry_after_secs));
                        }
                        continue;
                    }
                    // Small JSON answers must not wait for Nagle.
                    let _ = stream.set_nodelay(true);
                    let shared = Arc::clone(&shared);
                    let service = service_fn(move |req| handler::handle(Arc::clone(&shared), req));
                    let connection = http1::Builder::new()
                        .keep_alive(true)
                        .timer(TokioTimer::new())
                        // Also closes a keep-alive connection idle this long.
                        .header_read_timeout(limits.header_read_timeout)
                        .serve_connection(TokioIo::new(stream), service);
                    let connection = graceful.watch(connection);
                    connections.spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(target: LOG_TARGET, error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(target: LOG_TARGET, error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            Some(_) = refusals.join_next(), if !refusals.is_empty() => {}
        }
    };
    // Close the listening socket before the connections so no new client slips in between.
    drop(listener);
    refusals.shutdown().await;
    let mut cut = 0;
    if let Stop::Graceful(timeout) = how {
        // Each connection finishes the request it is in (hyper answers it, then closes);
        // idle ones close at once.
        if tokio::time::timeout(timeout, graceful.shutdown())
            .await
            .is_err()
        {
            cut = connections.len();
            tracing::warn!(target: LOG_TARGET, cut, "drain timed out; cutting the rest");
        }
    }
    connections.shutdown().await;
    cut
}

/// The answer to a connection past `max_connections`: a 503 the client can act on (back off
/// and retry) instead of a closed socket it cannot tell from a crash.
async fn refuse(mut stream: TcpStream, retry_after_secs: u32) {
    let body = r#"{"error":"too many connections"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {retry_after_secs}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent, so closing does not reset the connection under the
        // answer before the client read it.
        let mut sink = [0u8; 8192];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

impl ServerThread {
    pub(super) fn set_outage(&self, down: bool) -> io::Result<()> {
        let (ack, ack_rx) = std_mpsc::sync_channel(1);
        self.commands
            .send(Command::Outage { down, ack })
            .map_err(|_| stopped())?;
        match ack_rx.recv_timeout(CONTROL_TIMEOUT) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "collector did not confirm the outage change",
            )),
            Err(RecvTimeoutError::Disconnected) => Err(stopped()),
        }
    }

    /// Closes the listener and waits for every connection to finish (bounded by `timeout`);
    /// returns how many were cut at the bound.
    pub(super) fn drain(&self, timeout: Duration) -> usize {
        let (ack, ack_rx) = std_mpsc::sync_channel(1);
        if self.commands.send(Command::Drain { timeout, ack }).is_err() {
            return 0;
        }
        ack_rx.recv_timeout(timeout + CONTROL_TIMEOUT).unwrap_or(0)
    }

    /// Idempotent. Waits a bounded time for the thread, then detaches it rather than hang.
    pub(super) fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let _ = self.commands.send(Command::Shutdown);
        match self.exited.recv_timeout(SHUTDOWN_TIMEOUT) {
            Err(RecvTimeoutError::Disconnected) | Ok(()) => {
                if thread.join().is_err() {
                    tracing::warn!(target: LOG_TARGET, "collector thread panicked");
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(target: LOG_TARGET, "collector thread did not stop in time; detaching it");
            }
        }
    }
}
