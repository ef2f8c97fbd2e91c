//! A request whose answer the sender never reads: written on a connection of its own, which is
//! closed as soon as the answer begins. From the collector's side this is what a device's
//! timeout or a dead radio looks like after it sent a batch; the device then resends the same
//! ids, and the collector must store them once.
//!
//! The SDK's transport cannot drop an answer on purpose, so this writes HTTP/1.1 itself; the
//! body and headers are the SDK's request as built by `eventspool::batch_request`.

use std::time::Duration;

use eventspool::HttpRequest;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Only plain HTTP can be cut by hand; `Err` says what to do instead.
pub fn supported(endpoint: &str) -> Result<(), String> {
    match url::Url::parse(endpoint) {
        Ok(url) if url.scheme() == "http" => Ok(()),
        _ => Err("needs an http:// endpoint (the answer is dropped on a raw connection)".into()),
    }
}

/// Sends `request` to `endpoint` and hangs up when the answer starts (or at `deadline`).
/// `Ok` describes what was seen.
pub async fn send(
    endpoint: &str,
    request: &HttpRequest,
    deadline: Duration,
) -> Result<String, String> {
    let url = url::Url::parse(endpoint).map_err(|e| format!("--endpoint: {e}"))?;
    let addrs = url
        .socket_addrs(|| Some(80))
        .map_err(|e| format!("cannot resolve {endpoint}: {e}"))?;
    let host = &url[url::Position::BeforeHost..url::Position::AfterPort];
    let path = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let connect = TcpStream::connect(&addrs[..]);
    let mut stream = match tokio::time::timeout(deadline, connect).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(format!("could not connect: {e}")),
        Err(_) => return Err("could not connect within the deadline".into()),
    };
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n",
        request.body.len()
    );
    for (name, value) in &request.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&request.body).await?;
        stream.flush().await
    };
    match tokio::time::timeout(deadline, write).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("the connection broke while sending: {e}")),
        Err(_) => return Err("could not send the request within the deadline".into()),
    }
    // Readable means the answer began (or the collector closed): the work is done either way.
    let seen = match tokio::time::timeout(deadline, stream.readable()).await {
        Ok(Ok(())) => "its answer was dropped unread",
        Ok(Err(_)) => "the connection failed before an answer",
        Err(_) => "no answer began within the deadline; hung up",
    };
    drop(stream);
    Ok(seen.to_owned())
}
