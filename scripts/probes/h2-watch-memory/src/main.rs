//! Probe (scripts/probes/h2-watch-memory/run.sh): the resident memory a server process pays per open streaming response (a watch that
//! sends nothing), over HTTP/2 (many streams on one connection) and over HTTP/1.1 (one each).
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[global_allocator]
static A: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn watch(_req: hyper::Request<hyper::body::Incoming>) -> Result<hyper::Response<Body>, Infallible> {
    // A response whose body stays open: one event, then nothing (as an idle watch).
    let first = futures_util::stream::once(async { Ok::<_, Infallible>(Frame::data(Bytes::from_static(b": ok\n\n"))) });
    let body = StreamBody::new(futures_util::StreamExt::chain(first, futures_util::stream::pending()));
    Ok(hyper::Response::builder().header("content-type", "text/event-stream").body(body.boxed()).unwrap())
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with("VmRSS")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args[1].as_str() {
        "server" => {
            unsafe { libc_prctl() };
            let proto = args[2].clone();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            println!("{}", listener.local_addr().unwrap().port());
            tokio::spawn(async { loop { tokio::time::sleep(Duration::from_millis(500)).await; eprintln!("rss {}", rss_kib()); } });
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                stream.set_nodelay(true).unwrap();
                let proto = proto.clone();
                tokio::spawn(async move {
                    let io = TokioIo::new(stream);
                    let svc = hyper::service::service_fn(watch);
                    if proto == "h2" {
                        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                        b.max_concurrent_streams(200_000);
                        let _ = b.serve_connection(io, svc).await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                    }
                });
            }
        }
        "client" => {
            let port: u16 = args[2].parse().unwrap();
            let proto = args[3].clone();
            let n: usize = args[4].parse().unwrap();
            let mut held = Vec::new();
            if proto == "h2" {
                let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                    .handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(stream)).await.unwrap();
                tokio::spawn(conn);
                for _ in 0..n {
                    send.ready().await.unwrap();
                    let req = hyper::Request::get(format!("http://127.0.0.1:{port}/watch")).body(http_body_util::Empty::new()).unwrap();
                    let mut resp = send.send_request(req).await.unwrap();
                    let _ = resp.body_mut().frame().await;
                    held.push(resp);
                }
            } else {
                for _ in 0..n {
                    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                    let (mut send, conn) = hyper::client::conn::http1::handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(stream)).await.unwrap();
                    tokio::spawn(conn);
                    let req = hyper::Request::get("/watch").header("host", "x").body(http_body_util::Empty::new()).unwrap();
                    let mut resp = send.send_request(req).await.unwrap();
                    let _ = resp.body_mut().frame().await;
                    held.push(resp);
                }
            }
            println!("open {n}");
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        _ => unreachable!(),
    }
}

unsafe fn libc_prctl() {
    extern "C" { fn prctl(option: i32, ...) -> i32; }
    prctl(41 /* PR_SET_THP_DISABLE */, 1u64, 0u64, 0u64, 0u64);
}
