//! `mock-provider --listen 127.0.0.1:9000 [--no-record]`: runs the mock as a
//! standalone server until killed. Recording is off unless `--record`.

use std::net::SocketAddr;
use std::process::ExitCode;

use mock_provider::{MockOptions, MockProvider};

const USAGE: &str = "usage: mock-provider [--listen ADDR] [--no-record | --record]\n\
                     \n  --listen ADDR   address to bind (default 127.0.0.1:9000; port 0 picks one)\
                     \n  --no-record     do not keep requests in memory (default)\
                     \n  --record        keep every request in memory (only useful for debugging)";

struct Args {
    listen: SocketAddr,
    record: bool,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 9000));
    let mut record = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        match flag.as_str() {
            "--listen" => {
                let value = inline
                    .or_else(|| args.next())
                    .ok_or("--listen needs an address")?;
                listen = value
                    .parse()
                    .map_err(|err| format!("bad --listen address '{value}': {err}"))?;
            }
            "--no-record" => record = false,
            "--record" => record = true,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(Some(Args { listen, record }))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("mock-provider: {err}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let options = MockOptions {
        record: args.record,
    };
    let mock = match MockProvider::start_on_with(args.listen, options).await {
        Ok(mock) => mock,
        Err(err) => {
            eprintln!("mock-provider: cannot bind {}: {err}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    // Scripts wait for this line to learn the (possibly ephemeral) port.
    println!("listening on {}", mock.addr());
    // Serve until killed; a failure to install the handler just means the
    // process runs until it is killed some other way.
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
    drop(mock);
    ExitCode::SUCCESS
}
