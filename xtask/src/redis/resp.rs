//! Just enough RESP2 to ask our own servers whether they are ready: encode a command, read one
//! reply. No pipelining, no RESP3 (we never send `HELLO 3`), no pooling.

use std::borrow::Cow;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Connect, read and write timeout of [`call`]: a local server that takes longer is not ready.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(1);

/// Longest bulk string or array we accept; a larger length means we are not talking to Redis.
const MAX_LEN: usize = 64 << 20;

/// How deep arrays may nest (a Redis reply to our commands nests at most 3 levels).
const MAX_DEPTH: usize = 16;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`, `-MOVED 3999 127.0.0.1:6381`: the server refused the command.
    Error(String),
    /// `:42`
    Integer(i64),
    /// `$3\r\nfoo`
    Bulk(Vec<u8>),
    /// `$-1` or `*-1`
    Nil,
    /// `*2\r\n...`
    Array(Vec<Value>),
}

impl Value {
    /// The text of a simple or bulk string (lossy UTF-8); `None` for other kinds.
    pub(crate) fn text(&self) -> Option<Cow<'_, str>> {
        match self {
            Value::Simple(s) => Some(Cow::Borrowed(s)),
            Value::Bulk(bytes) => Some(String::from_utf8_lossy(bytes)),
            _ => None,
        }
    }

    /// The elements of an array; `None` for other kinds.
    pub(crate) fn array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The text of a string reply, or an error naming what came instead (including a server error).
    pub(crate) fn into_text(self) -> io::Result<String> {
        match self {
            Value::Simple(s) => Ok(s),
            Value::Bulk(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Value::Error(err) => Err(invalid(format!("server error: {err}"))),
            other => Err(invalid(format!("expected a string reply, got {other:?}"))),
        }
    }

    /// A flat `[key, value, key, value, ...]` array (as `SENTINEL master` replies) as pairs.
    pub(crate) fn pairs(&self) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
        let items = self.array().unwrap_or_default();
        items
            .chunks_exact(2)
            .filter_map(|pair| Some((pair[0].text()?, pair[1].text()?)))
            .collect()
    }

    /// The value of `key` in a reply [`pairs`](Value::pairs) understands.
    pub(crate) fn field(&self, key: &str) -> Option<String> {
        self.pairs()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }
}

/// An [`io::ErrorKind::InvalidData`] error with `message`.
fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// A command as RESP sends it: an array of bulk strings.
pub(crate) fn encode<S: AsRef<[u8]>>(args: &[S]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one complete reply.
pub(crate) fn read_value(reader: &mut impl BufRead) -> io::Result<Value> {
    read_nested(reader, 0)
}

/// [`read_value`] at nesting level `depth`.
fn read_nested(reader: &mut impl BufRead, depth: usize) -> io::Result<Value> {
    if depth > MAX_DEPTH {
        return Err(invalid("reply nests too deep"));
    }
    let line = read_line(reader)?;
    let (kind, rest) = line
        .split_first()
        .ok_or_else(|| invalid("empty reply line"))?;
    let rest = String::from_utf8_lossy(rest).into_owned();
    match kind {
        b'+' => Ok(Value::Simple(rest)),
        b'-' => Ok(Value::Error(rest)),
        b':' => rest
            .parse()
            .map(Value::Integer)
            .map_err(|_| invalid(format!("bad integer reply {rest:?}"))),
        b'$' => match length(&rest)? {
            None => Ok(Value::Nil),
            Some(len) => {
                let mut bytes = vec![0; len + 2];
                reader.read_exact(&mut bytes)?;
                if !bytes.ends_with(b"\r\n") {
                    return Err(invalid("bulk string not terminated by CRLF"));
                }
                bytes.truncate(len);
                Ok(Value::Bulk(bytes))
            }
        },
        b'*' => match length(&rest)? {
            None => Ok(Value::Nil),
            Some(len) => (0..len)
                .map(|_| read_nested(reader, depth + 1))
                .collect::<io::Result<_>>()
                .map(Value::Array),
        },
        other => Err(invalid(format!(
            "unknown reply type {:?}",
            char::from(*other)
        ))),
    }
}

/// A bulk or array length: `None` for `-1` (nil).
fn length(text: &str) -> io::Result<Option<usize>> {
    if text == "-1" {
        return Ok(None);
    }
    match text.parse::<usize>() {
        Ok(len) if len <= MAX_LEN => Ok(Some(len)),
        _ => Err(invalid(format!("bad length {text:?}"))),
    }
}

/// One `\r\n`-terminated line, without the terminator.
fn read_line(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    // `take` bounds the line so garbage without newlines cannot grow it without limit.
    let read = Read::take(&mut *reader, MAX_LEN as u64).read_until(b'\n', &mut line)?;
    if read == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(invalid("reply line not terminated by CRLF"));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

/// A connection to a server on 127.0.0.1, with [`TIMEOUT`] on every operation.
pub(crate) struct Connection {
    /// Reads replies.
    reader: BufReader<TcpStream>,
    /// Writes commands (a clone of the reader's stream).
    writer: TcpStream,
}

impl Connection {
    /// Connects to 127.0.0.1:`port`.
    pub(crate) fn open(port: u16) -> io::Result<Connection> {
        let stream =
            TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), TIMEOUT)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
        })
    }

    /// Sends `args` as one command and reads its reply; a server error is an `Ok(Value::Error)`.
    pub(crate) fn call(&mut self, args: &[&str]) -> io::Result<Value> {
        self.writer.write_all(&encode(args))?;
        read_value(&mut self.reader)
    }
}

/// Sends one command to 127.0.0.1:`port` on a fresh connection and reads its reply.
pub(crate) fn call(port: u16, args: &[&str]) -> io::Result<Value> {
    Connection::open(port)?.call(args)
}

/// Sends one command and expects a string reply (`INFO`, `CLUSTER INFO`, `SET` → `OK`, ...).
pub(crate) fn call_text(port: u16, args: &[&str]) -> io::Result<String> {
    call(port, args)?.into_text()
}

/// The value of `name` in an `INFO`-style reply (`name:value` lines), trimmed.
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then_some(value.trim())
    })
}

/// The port a `MOVED <slot> <host>:<port>` or `ASK <slot> <host>:<port>` error redirects to.
pub(crate) fn redirect_port(error: &str) -> Option<u16> {
    let mut words = error.split_whitespace();
    if !matches!(words.next(), Some("MOVED" | "ASK")) {
        return None;
    }
    let _slot = words.next()?;
    words.next()?.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `bytes` as exactly one reply.
    fn parse(bytes: &[u8]) -> io::Result<Value> {
        let mut reader = bytes;
        let value = read_value(&mut reader)?;
        assert!(reader.is_empty(), "left over: {reader:?}");
        Ok(value)
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(encode(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(
            encode(&["SET", "{xtask}probe", ""]),
            b"*3\r\n$3\r\nSET\r\n$12\r\n{xtask}probe\r\n$0\r\n\r\n"
        );
        let binary: [&[u8]; 1] = [b"a\r\nb"];
        assert_eq!(encode(&binary), b"*1\r\n$4\r\na\r\nb\r\n");
    }

    #[test]
    fn every_reply_kind_parses() -> io::Result<()> {
        assert_eq!(parse(b"+PONG\r\n")?, Value::Simple("PONG".into()));
        assert_eq!(
            parse(b"-CLUSTERDOWN The cluster is down\r\n")?,
            Value::Error("CLUSTERDOWN The cluster is down".into())
        );
        assert_eq!(parse(b":-42\r\n")?, Value::Integer(-42));
        assert_eq!(
            parse(b"$5\r\na\r\nbc\r\n")?,
            Value::Bulk(b"a\r\nbc".to_vec())
        );
        assert_eq!(parse(b"$0\r\n\r\n")?, Value::Bulk(Vec::new()));
        assert_eq!(parse(b"$-1\r\n")?, Value::Nil);
        assert_eq!(parse(b"*-1\r\n")?, Value::Nil);
        assert_eq!(parse(b"*0\r\n")?, Value::Array(Vec::new()));
        Ok(())
    }

    #[test]
    fn nested_arrays_parse() -> io::Result<()> {
        let reply = parse(b"*2\r\n*2\r\n$4\r\nname\r\n$3\r\nabc\r\n*1\r\n:7\r\n")?;
        let outer = reply.array().unwrap_or_default();
        assert_eq!(outer.len(), 2);
        assert_eq!(outer[0].field("name").as_deref(), Some("abc"));
        assert_eq!(outer[1], Value::Array(vec![Value::Integer(7)]));
        Ok(())
    }

    #[test]
    fn malformed_replies_are_errors() {
        for bad in [
            &b""[..],
            b"+OK\n",
            b"+OK",
            b"?what\r\n",
            b":x\r\n",
            b"$3\r\nab\r\n",
            b"$3\r\nabcd\r\n",
            b"$-2\r\n",
            b"$99999999999\r\n",
            b"*2\r\n+a\r\n",
        ] {
            let mut reader = bad;
            assert!(read_value(&mut reader).is_err(), "{:?}", bad.escape_ascii());
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
        let ok = "*1\r\n".repeat(MAX_DEPTH) + ":1\r\n";
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn replies_read_back_to_back() -> io::Result<()> {
        let mut reader = &b"+OK\r\n:1\r\n"[..];
        assert_eq!(read_value(&mut reader)?, Value::Simple("OK".into()));
        assert_eq!(read_value(&mut reader)?, Value::Integer(1));
        Ok(())
    }

    #[test]
    fn text_and_errors() {
        assert_eq!(
            Value::Simple("OK".into()).into_text().ok(),
            Some("OK".into())
        );
        assert_eq!(
            Value::Bulk(b"x".to_vec()).into_text().ok(),
            Some("x".into())
        );
        let err = Value::Error("ERR nope".into()).into_text().err();
        assert!(err.is_some_and(|e| e.to_string().contains("ERR nope")));
        assert!(Value::Integer(1).into_text().is_err());
        assert!(Value::Nil.text().is_none());
    }

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let info = "# Cluster\r\ncluster_state:ok\r\ncluster_slots_ok:16384\r\n\
                    cluster_known_nodes:6\r\nmaster_link_status:up\r\n";
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "cluster_known_nodes"), Some("6"));
        assert_eq!(info_field(info, "master_link_status"), Some("up"));
        assert_eq!(info_field(info, "cluster"), None);
        assert_eq!(info_field(info, "missing"), None);
    }

    #[test]
    fn redirects_name_their_port() {
        assert_eq!(redirect_port("MOVED 3999 127.0.0.1:6381"), Some(6381));
        assert_eq!(redirect_port("ASK 3999 127.0.0.1:7002"), Some(7002));
        assert_eq!(redirect_port("CLUSTERDOWN Hash slot not served"), None);
        assert_eq!(redirect_port("MOVED 3999"), None);
    }
}
