//! Helpers shared by the integration tests: a tiny raw HTTP/1.1 client, so
//! the tests see exactly what goes over the wire.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Extra request headers.
pub type Headers<'a> = &'a [(&'a str, &'a str)];

/// Upper bound for any single exchange, so a bug fails instead of hanging.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// A tiny HTTP/1.1 client: Content-Length requests, Content-Length / chunked /
// read-to-EOF responses.
// ---------------------------------------------------------------------------

#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
pub struct Response {
    pub head: Head,
    pub body: Vec<u8>,
}

impl Response {
    pub fn status(&self) -> u16 {
        self.head.status
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!(
                "response is not JSON ({err}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

pub struct Conn {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.expect("connect to mock");
        stream.set_nodelay(true).expect("nodelay");
        let (read, write) = stream.into_split();
        Conn {
            reader: BufReader::new(read),
            writer: write,
        }
    }

    /// Writes the request head and body.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<()> {
        write_request(&mut self.writer, method, path, headers, body).await
    }

    /// Sends a request and reads the complete response. Writing and reading
    /// run concurrently so a server that streams its answer while the body
    /// is still arriving (echo) cannot deadlock with us.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let Conn { reader, writer } = self;
        let write = write_request(writer, method, path, headers, body);
        let read = async {
            let head = read_head(reader).await?;
            let body = read_body(reader, &head).await?;
            Ok::<_, io::Error>(Response { head, body })
        };
        let (written, response) =
            tokio::time::timeout(IO_TIMEOUT, async { tokio::join!(write, read) })
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "exchange timed out"))?;
        // A server may answer (or hang up) before reading the whole body;
        // the response is what matters then.
        match (written, response) {
            (_, Ok(response)) => Ok(response),
            (_, Err(err)) => Err(err),
        }
    }

    pub async fn read_head(&mut self) -> io::Result<Head> {
        read_head(&mut self.reader).await
    }

    pub async fn next_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        next_chunk(&mut self.reader).await
    }
}

async fn write_request(
    writer: &mut OwnedWriteHalf,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<()> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    writer.write_all(head.as_bytes()).await?;
    writer.write_all(body).await?;
    writer.flush().await
}

async fn read_line(reader: &mut BufReader<OwnedReadHalf>) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

async fn read_head(reader: &mut BufReader<OwnedReadHalf>) -> io::Result<Head> {
    let status_line = read_line(reader).await?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, status_line.clone()))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader).await?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Head { status, headers })
}

async fn read_body(reader: &mut BufReader<OwnedReadHalf>, head: &Head) -> io::Result<Vec<u8>> {
    if head
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        let mut body = Vec::new();
        while let Some(chunk) = next_chunk(reader).await? {
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    } else if let Some(len) = head.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "content-length"))?;
        let mut body = vec![0; len];
        reader.read_exact(&mut body).await?;
        Ok(body)
    } else {
        let mut body = Vec::new();
        reader.read_to_end(&mut body).await?;
        Ok(body)
    }
}

/// One chunk of a chunked body, or `None` at the terminating chunk.
async fn next_chunk(reader: &mut BufReader<OwnedReadHalf>) -> io::Result<Option<Vec<u8>>> {
    let size_line = read_line(reader).await?;
    let size_hex = size_line.split(';').next().unwrap_or("").trim();
    let size = usize::from_str_radix(size_hex, 16)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, size_line.clone()))?;
    if size == 0 {
        // Trailers, then the empty line.
        while !read_line(reader).await?.is_empty() {}
        return Ok(None);
    }
    let mut chunk = vec![0; size];
    reader.read_exact(&mut chunk).await?;
    let mut crlf = [0; 2];
    reader.read_exact(&mut crlf).await?;
    Ok(Some(chunk))
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    Conn::connect(addr)
        .await
        .request(method, path, headers, body)
        .await
        .unwrap_or_else(|err| panic!("{method} {path}: {err}"))
}

pub async fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], b"").await
}

pub async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Response {
    post_json_with(addr, path, &[], body).await
}

pub async fn post_json_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Response {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    request(addr, "POST", path, &all, body.to_string().as_bytes()).await
}
