//! Whether a request's client is still there. actix-web runs a handler to
//! its end after its client has closed the connection, so a client that
//! gave up would leave its work running for nobody. Each connection keeps
//! a duplicate of its socket ([`on_connect`]); [`left`] looks at it every
//! [`WATCH_EVERY`] without reading from it: a closed or reset connection
//! with nothing left unread is a client gone. The middleware
//! (`observe.rs`) then drops the handler's future, which drops the
//! engine's job: MLX stops it within one chunk or pass, the vLLM backend
//! cancels its upstream requests. A client that half-closes its end while
//! it waits for the answer is taken as gone, as vLLM's server takes it.

use std::any::Any;
use std::time::Duration;

use actix_web::dev::Extensions;

/// How often a waiting request's connection is looked at.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);

/// A duplicate of a connection's socket, to look at without reading.
#[derive(Clone)]
pub struct Peer(std::rc::Rc<std::net::TcpStream>);

/// Keeps a duplicate of each TCP connection's socket among the
/// connection's data (`HttpServer::on_connect`).
pub fn on_connect(connection: &dyn Any, data: &mut Extensions) {
    #[cfg(unix)]
    if let Some(socket) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
        use std::os::fd::AsFd;
        // The duplicate shares the socket's non-blocking mode, so a look
        // never waits.
        if let Ok(fd) = socket.as_fd().try_clone_to_owned() {
            data.insert(Peer(std::rc::Rc::new(std::net::TcpStream::from(fd))));
        }
    }
    #[cfg(not(unix))]
    let _ = (connection, data);
}

impl Peer {
    /// Whether the client closed or reset the connection with nothing
    /// unread: a look that finds bytes (a pipelined request) or none yet
    /// is a client still there.
    fn gone(&self) -> bool {
        match self.0.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

/// Resolves once the client on `peer` (a request's `conn_data`) has left;
/// never where its connection cannot be looked at.
pub async fn left(peer: Option<Peer>) {
    let Some(peer) = peer else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if peer.gone() {
            return;
        }
    }
}
