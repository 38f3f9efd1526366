//! Which local user a TCP client is: the kernel's socket diagnostics
//! (`NETLINK_SOCK_DIAG`, an `inet_diag` request for the exact 4-tuple of
//! the client's socket) report the uid that created it.
//!
//! Looked up right after accept, while our end of the connection is open:
//! the client's socket cannot then have reached `TIME_WAIT` (that needs our
//! FIN), whose diagnostics would report uid 0. The reply is taken only for
//! a socket in a state a live client can be in, with exactly the tuple
//! asked for, so a listener or a request socket matched by the lookup
//! (both report uid 0 or someone else's uid) never stands for the client.

use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_sock_diag::{
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    SockDiagMessage,
};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr as NetlinkAddr};
use thiserror::Error;

/// `INET_DIAG_NOCOOKIE`: the lookup matches on the tuple alone.
const NO_COOKIE: [u8; 8] = [0xff; 8];

/// TCP states (`include/net/tcp_states.h`) a client's socket is in while
/// the server has not closed: connected, or half-closed by the client.
const CLIENT_STATES: [u8; 3] = [
    1, /* ESTABLISHED */
    4, /* FIN_WAIT1 */
    5, /* FIN_WAIT2 */
];

/// Why a client's uid is not known.
#[derive(Debug, Error)]
pub enum PeerError {
    #[error("socket diagnostics failed: {0}")]
    Netlink(#[source] std::io::Error),
    #[error("the kernel's answer could not be read: {0}")]
    Decode(String),
    #[error("no local socket connected to us from {0}")]
    NotLocal(SocketAddr),
}

/// Who is at the other end of a connection, as the accept loop found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The client's address.
    pub addr: SocketAddr,
    /// The uid owning the client's socket: `None` when the socket is not on
    /// this host (a remote client) or could not be looked up.
    pub uid: Option<u32>,
}

impl Client {
    /// Looks up who `peer` (connected to our `local`) is. A failed lookup
    /// is logged at debug level and leaves `uid` unknown.
    pub fn of(peer: SocketAddr, local: SocketAddr) -> Client {
        let uid = match owner_uid(peer, local) {
            Ok(uid) => Some(uid),
            Err(e) => {
                tracing::debug!(%peer, "client uid unknown: {e}");
                None
            }
        };
        Client { addr: peer, uid }
    }

    /// Whether the client connected over loopback: a local process,
    /// whatever its socket lookup said.
    pub fn is_loopback(&self) -> bool {
        self.addr.ip().to_canonical().is_loopback()
    }
}

/// The uid that owns the local TCP socket connected from `peer` to `local`.
/// An IPv4 client reaching an IPv6 listener shows as `::ffff:a.b.c.d`; its
/// own socket may be either family, so both are asked.
pub fn owner_uid(peer: SocketAddr, local: SocketAddr) -> Result<u32, PeerError> {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (peer4, local4) = (canonical(peer), canonical(local));
    let mut last = PeerError::NotLocal(peer);
    let mut tuples = vec![(peer, local)];
    if (peer4, local4) != (peer, local) {
        tuples.insert(0, (peer4, local4));
    }
    for (src, dst) in tuples {
        match lookup(src, dst) {
            Ok(Some(uid)) => return Ok(uid),
            Ok(None) => {}
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// One exact `inet_diag` lookup of the socket whose local end is `src` and
/// remote end `dst`; `None` when there is none (or not a client's).
fn lookup(src: SocketAddr, dst: SocketAddr) -> Result<Option<u32>, PeerError> {
    let family = match (src.ip(), dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => AF_INET6,
        _ => return Ok(None),
    };
    let wanted = SocketId {
        source_port: src.port(),
        destination_port: dst.port(),
        source_address: src.ip(),
        destination_address: dst.ip(),
        interface_id: 0,
        cookie: NO_COOKIE,
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut packet = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: wanted.clone(),
        })
        .into(),
    );
    packet.finalize();
    let mut request = vec![0; packet.buffer_len()];
    packet.serialize(&mut request);

    let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(PeerError::Netlink)?;
    socket.bind_auto().map_err(PeerError::Netlink)?;
    socket
        .connect(&NetlinkAddr::new(0, 0))
        .map_err(PeerError::Netlink)?;
    socket.send(&request, 0).map_err(PeerError::Netlink)?;
    // The kernel answers within the send (sock_diag runs in the sender's
    // context): never waiting keeps a missing answer from blocking a
    // worker.
    socket.set_non_blocking(true).map_err(PeerError::Netlink)?;
    let mut reply = vec![0u8; 8192];
    let len = socket
        .recv(&mut &mut reply[..], 0)
        .map_err(PeerError::Netlink)?;
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(&reply[..len.min(reply.len())])
        .map_err(|e| PeerError::Decode(e.to_string()))?;
    match message.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
            let h = &response.header;
            let id = &h.socket_id;
            let exact = id.source_address == wanted.source_address
                && id.source_port == wanted.source_port
                && id.destination_address == wanted.destination_address
                && id.destination_port == wanted.destination_port;
            Ok((exact && CLIENT_STATES.contains(&h.state)).then_some(h.uid))
        }
        // ENOENT: no such socket here.
        NetlinkPayload::Error(e) if e.raw_code() == -libc::ENOENT => Ok(None),
        NetlinkPayload::Error(e) => Err(PeerError::Netlink(e.to_io())),
        other => Err(PeerError::Decode(format!(
            "unexpected message type {}",
            other.message_type()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    fn my_uid() -> u32 {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn finds_the_owner_of_a_loopback_client_v4_and_v6() {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(bind) else {
                continue; // no IPv6 loopback here
            };
            let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (served, peer) = listener.accept().unwrap();
            assert_eq!(peer, client.local_addr().unwrap());
            let uid = owner_uid(peer, served.local_addr().unwrap()).unwrap();
            assert_eq!(uid, my_uid(), "{bind}");
        }
    }

    #[test]
    fn finds_an_ipv4_client_of_a_dual_stack_listener() {
        let Ok(listener) = TcpListener::bind("[::]:0") else {
            return;
        };
        let port = listener.local_addr().unwrap().port();
        let _client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (served, peer) = listener.accept().unwrap();
        let uid = owner_uid(peer, served.local_addr().unwrap()).unwrap();
        assert_eq!(uid, my_uid());
    }

    #[test]
    fn a_closed_or_made_up_client_has_no_uid() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let made_up: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(owner_uid(made_up, local).is_err());
        // Our own accepted end, looked up the wrong way round, is not a
        // client: the listener's port is not a client's.
        let client = TcpStream::connect(local).unwrap();
        let (served, peer) = listener.accept().unwrap();
        drop(client);
        drop(served);
        assert!(Client::of(peer, local).uid.is_none());
    }
}
