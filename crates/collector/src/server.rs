//! The server thread: its runtime, the accept loop, and the control loop that takes the
//! socket down and up again for outages.
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
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::state::Shared;
use super::{CONTROL_TIMEOUT, MAX_CONNECTIONS, SHUTDOWN_TIMEOUT, handler};

const LOG_TARGET: &str = "eventspool::collector";
/// Enough for bursts of parallel connects in benchmarks.
const LISTEN_BACKLOG: u32 = 1024;
/// Pause after a failed accept (e.g. out of file descriptors) so the loop cannot spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

enum Command {
    Outage {
        down: bool,
        ack: std_mpsc::SyncSender<io::Result<()>>,
    },
    Shutdown,
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
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
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Serving {
    fn start(listener: TcpListener, shared: Arc<Shared>) -> Serving {
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, shared, stop_rx));
        Serving { stop, task }
    }

    /// Returns once the listener and every connection are closed.
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
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
            Command::Shutdown => break,
        }
    }
    if let Some(s) = serving.take() {
        s.stop().await;
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if connections.len() >= MAX_CONNECTIONS {
                        tracing::warn!(target: LOG_TARGET, "too many connections; closing a new one");
                        continue;
                    }
                    // Small JSON answers must not wait for Nagle.
                    let _ = stream.set_nodelay(true);
                    let shared = Arc::clone(&shared);
                    connections.spawn(async move {
                        let service = service_fn(move |req| handler::handle(Arc::clone(&shared), req));
                        let served = http1::Builder::new()
                            .keep_alive(true)
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                        if let Err(e) = served {
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
        }
    }
    // Close the listening socket before the connections so no new client slips in between.
    drop(listener);
    connections.shutdown().await;
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
