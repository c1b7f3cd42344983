//! The stable HTTP address of a local federation: a TCP relay that passes each connection to whichever broker
//! serves the API now, so the address `meridian up` prints stays valid across a broker restart and a takeover
//! (a restarted broker listens on a new port; a standby opens the API once it is active).
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a connection waits for a broker to serve the API (a takeover takes the lease time).
const WAIT_FOR_A_BROKER: Duration = Duration::from_secs(15);

#[derive(Debug)]
pub struct Relay {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on a free loopback port; each connection goes to the first broker whose address file (written
    /// by the broker once it serves the API) names an address that accepts it.
    pub fn start(address_files: Vec<PathBuf>) -> io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let files = Arc::new(address_files);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let files = files.clone();
                std::thread::spawn(move || {
                    if let Some(broker) = connect(&files) {
                        relay(client, broker);
                    }
                });
            }
        });
        Ok(Relay { addr, stop })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn connect(files: &[PathBuf]) -> Option<TcpStream> {
    let deadline = Instant::now() + WAIT_FOR_A_BROKER;
    while Instant::now() < deadline {
        for f in files {
            let Some(addr) = std::fs::read_to_string(f)
                .ok()
                .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            else {
                continue;
            };
            if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                return Some(s);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Copies both ways until either side closes.
fn relay(client: TcpStream, broker: TcpStream) {
    let (Ok(c2), Ok(b2)) = (client.try_clone(), broker.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || copy(client, broker));
    copy(b2, c2);
    let _ = up.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
