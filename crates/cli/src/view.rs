//! `rootline view FILE [--port N] [--no-open] [--timeout SECS]`: shows a profile in the speedscope
//! web app, served from the binary on 127.0.0.1.
//!
//! The app's built files are embedded at compile time (`assets/speedscope/release/`, see
//! `build.rs`), so viewing needs no network. The profile is converted to speedscope's JSON and
//! served at a path holding a random token (other local users and web pages can't guess it); the
//! printed URL hands that path to the app with its `#profileURL=` parameter. The URL is relative
//! to the page, so it keeps working through an SSH port forward to another port.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rootline_profile::Profile;
use tiny_http::{Header, Method, Request, Response, Server};

use crate::input;

/// The speedscope web app's files: `(file name, contents)`, sorted by name.
const ASSETS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/speedscope_assets.rs"));

/// How often the serving loop looks at the stop flag and the deadline.
const POLL: Duration = Duration::from_millis(200);

/// Arguments of `rootline view`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profile to show (any format rootline reads).
    pub input: PathBuf,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Input format, overriding the extension and content of INPUT.
    #[arg(long, value_name = "F")]
    pub input_format: Option<String>,
}

/// How the viewer is served; shared by `view` and `record --view`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Port to serve the viewer on, on 127.0.0.1 (default: a free port).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub port: u16,
    /// Only print the viewer's URL; don't open a browser.
    #[arg(long)]
    pub no_open: bool,
    /// Stop serving after this many seconds (default: until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
}

/// Runs `rootline view`.
pub fn run(args: Args) -> Result<()> {
    let profile = input::read_profile(&args.input, args.input_format.as_deref())?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Release))
        .context("can't install the Ctrl-C handler")?;
    serve(&profile, &args.input, &args.serve, &stop)
}

/// Serves `profile` (read from or written to `source`) to the viewer until `stop` is set or the
/// timeout passes. Prints the viewer's URL on stdout and opens it where a desktop session exists.
pub fn serve(profile: &Profile, source: &Path, args: &ServeArgs, stop: &AtomicBool) -> Result<()> {
    let deadline = match args.timeout {
        Some(secs) if secs > 0.0 && secs.is_finite() => {
            Some(Instant::now() + Duration::from_secs_f64(secs))
        }
        Some(secs) => bail!("--timeout must be a positive number of seconds, not {secs}"),
        None => None,
    };
    let title = source.file_name().map_or_else(
        || "rootline profile".to_owned(),
        |n| format!("{} — rootline", n.to_string_lossy()),
    );
    let mut json = Vec::new();
    rootline_formats::speedscope::write_titled(profile, Some(&title), &mut json)
        .context("converting the profile for the viewer")?;
    let server = Server::http(SocketAddr::from((Ipv4Addr::LOCALHOST, args.port))).map_err(|e| {
        anyhow!(
            "can't serve the viewer on 127.0.0.1:{}: {e}; choose another --port (0 picks a free one)",
            args.port
        )
    })?;
    let port = server
        .server_addr()
        .to_ip()
        .map(|a| a.port())
        .context("the viewer's server has no IP address")?;
    let profile_path = format!("/profile/{}/{}", token()?, profile_file_name(source));
    let url = format!(
        "http://127.0.0.1:{port}/#profileURL={}",
        profile_path.replace('/', "%2F")
    );
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{url}")?;
        out.flush()?;
    }
    eprintln!(
        "rootline: serving {} in speedscope at the URL above (127.0.0.1 only); {}",
        source.display(),
        if deadline.is_some() {
            "it stops after --timeout or on Ctrl-C"
        } else {
            "press Ctrl-C to stop"
        }
    );
    if !args.no_open {
        open_browser(&url);
    }
    let mut loaded = false;
    while !stop.load(Ordering::Acquire) && deadline.is_none_or(|d| Instant::now() < d) {
        let request = match server.recv_timeout(POLL) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("the viewer's server failed"),
        };
        let served_profile = respond(request, &profile_path, &json);
        if served_profile && !loaded {
            loaded = true;
            eprintln!("rootline: the viewer loaded the profile");
        }
    }
    Ok(())
}

/// Answers one request; true when it was for the profile and it was sent.
fn respond(request: Request, profile_path: &str, json: &[u8]) -> bool {
    if !matches!(request.method(), Method::Get | Method::Head) {
        let _ = request.respond(Response::empty(405));
        return false;
    }
    let path = request.url().split(['?', '#']).next().unwrap_or("/");
    if path == profile_path {
        let sent = request
            .respond(Response::from_data(json).with_header(header("application/json")))
            .is_ok();
        return sent;
    }
    let name = match path.trim_start_matches('/') {
        "" => "index.html",
        name => name,
    };
    let response = match ASSETS.binary_search_by(|(n, _)| (*n).cmp(name)) {
        Ok(i) => Response::from_data(ASSETS[i].1).with_header(header(content_type(name))),
        Err(_) => Response::from_string("not found").with_status_code(404),
    };
    let _ = request.respond(response);
    false
}

fn header(content_type: &str) -> Header {
    Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes())
        .expect("a static content type is a valid header")
}

/// The media type the app's files need (scripts and WebAssembly are refused under others).
fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map_or("", |(_, ext)| ext) {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "wasm" => "application/wasm",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" | "md" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// 128 random bits in hex: the secret part of the profile's path.
fn token() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow!("can't get random bytes from the OS: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The name speedscope shows for the file: `SOURCE.speedscope.json`, reduced to URL-safe characters.
fn profile_file_name(source: &Path) -> String {
    let stem = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = stem.strip_suffix(".speedscope.json").unwrap_or(&stem);
    let safe: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = if safe.is_empty() { "profile" } else { &safe };
    format!("{safe}.speedscope.json")
}

/// Opens `url` with `xdg-open` when a desktop session is there (DISPLAY or WAYLAND_DISPLAY set);
/// says so and carries on when that fails.
fn open_browser(url: &str) {
    let desktop = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    if !desktop {
        return;
    }
    match Command::new("xdg-open")
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(mut child) => {
            // Reaped in the background so it never lingers as a zombie while we serve.
            std::thread::spawn(move || {
                if !child.wait().is_ok_and(|s| s.success()) {
                    eprintln!(
                        "rootline: note: xdg-open couldn't open a browser; open the URL yourself"
                    );
                }
            });
        }
        Err(e) => {
            eprintln!("rootline: note: can't run xdg-open ({e}); open the URL above in a browser")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_app_is_embedded_and_sorted_for_lookup() {
        assert!(ASSETS.windows(2).all(|w| w[0].0 < w[1].0));
        let index = ASSETS.iter().find(|(n, _)| *n == "index.html").unwrap().1;
        let index = std::str::from_utf8(index).unwrap();
        // Every file the page links to is embedded.
        for linked in index.split(['"']).filter(|s| s.starts_with("speedscope-")) {
            assert!(ASSETS.iter().any(|(n, _)| *n == linked), "{linked} missing");
        }
    }

    #[test]
    fn profile_names_are_url_safe() {
        assert_eq!(
            profile_file_name(Path::new("/tmp/my run #2.rlp")),
            "my_run__2.rlp.speedscope.json"
        );
        assert_eq!(
            profile_file_name(Path::new("x.speedscope.json")),
            "x.speedscope.json"
        );
    }
}
