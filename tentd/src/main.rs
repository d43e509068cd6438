//! `tentd`: one engine for the node. It runs an engine from the usual
//! configuration (`TENT_CONF`, the `TENT_<PATH>` variables, or
//! `--config`) and serves it at a unix socket, where processes attach
//! (`Engine::attach`, or the `daemon_socket` key). It stops on SIGINT or
//! SIGTERM.

use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "One tent engine per node, shared by every process on it"
)]
struct Args {
    /// The socket clients attach at (default: the configuration's
    /// `daemon_socket`, else $XDG_RUNTIME_DIR/tentd.sock, else
    /// /run/tent/tentd.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The engine's configuration: a JSON file (default: as an embedded
    /// engine loads it, from TENT_CONF and TENT_<PATH> variables).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Clients attached at once.
    #[arg(long, default_value_t = 64)]
    max_clients: usize,
    /// Bytes of memory one client may hold.
    #[arg(long, default_value_t = 16 << 30)]
    client_bytes: u64,
    /// Also serve the processes of this group (a name or a gid): the
    /// socket is then 0660 and of this group. A member reaches what the
    /// daemon reaches for it (the segments it may open), never another
    /// client's memory or the daemon's own segment.
    #[arg(long)]
    group: Option<String>,
    /// A weight for some clients: `uid:N=W`, `gid:N=W` or `name:NAME=W`
    /// (the name a client gives, `daemon_client_name`), W from 1 to 1000;
    /// repeat for more (the first that names a client counts; default 1).
    /// Within a priority, clients with work share the workers in
    /// proportion to their weights.
    #[arg(long = "weight", value_parser = parse_weight)]
    weights: Vec<tent::daemon::ClientWeight>,
}

fn parse_weight(s: &str) -> Result<tent::daemon::ClientWeight, String> {
    s.parse().map_err(|e: tent::Error| e.to_string())
}

/// `name` as a gid: a number, or a group's name (`getgrnam_r`).
fn gid_of(name: &str) -> Result<u32, String> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let cname =
        std::ffi::CString::new(name).map_err(|_| format!("--group {name:?}: a NUL in it"))?;
    // SAFETY: `libc::group` is integers and pointers, for which all zeroes is a value.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as std::ffi::c_char; 16 << 10];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is to memory we own, `buf` as long as we say; the result points into `grp` or is null.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(format!("--group {name:?}: no such group"));
    }
    Ok(grp.gr_gid)
}

/// The eventfd the signal handler writes (-1 until it is made): the main
/// thread sleeps in a read of it, waking for nothing else.
static STOP_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: std::ffi::c_int) {
    let fd = STOP_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one = 1u64;
        // SAFETY: write(2) is async-signal-safe; `one` is 8 readable bytes; a failed write (the counter full) still leaves the eventfd readable.
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("tentd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let config = match &args.config {
        Some(p) => tent::Config::from_file(p),
        None => tent::Config::load(),
    }
    .map_err(|e| e.to_string())?;
    // The daemon holds every client's memory: its own user's other
    // processes do not read it through /proc, nor attach a debugger.
    let mut config = config;
    config.non_dumpable = true;
    // `daemon_socket` is what clients attach to: the daemon serves there
    // (unless --socket says otherwise) and runs its engine itself.
    let socket = args
        .socket
        .clone()
        .or_else(|| (!config.daemon_socket.is_empty()).then(|| config.daemon_socket.clone().into()))
        .unwrap_or_else(tent::daemon::default_socket_path);
    config.daemon_socket.clear();
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let engine = tent::Engine::new(config).map_err(|e| e.to_string())?;
    let limits = tent::daemon::DaemonLimits {
        clients: args.max_clients,
        bytes_per_client: args.client_bytes,
        client_group: args.group.as_deref().map(gid_of).transpose()?,
        weights: args.weights.clone(),
        ..Default::default()
    };
    let daemon =
        tent::daemon::Daemon::start_with(engine, &socket, limits).map_err(|e| e.to_string())?;
    // SAFETY: eventfd(2) takes no pointers; a descriptor it returns is ours to own.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if raw < 0 {
        return Err(format!("an eventfd: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a descriptor just made and owned by nothing else.
    let stop = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    STOP_FD.store(stop.as_raw_fd(), Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only loads an atomic and writes an eventfd, both async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    println!(
        "tentd: serving segment {} at {}",
        daemon.engine().segment_name(),
        socket.display()
    );
    // Asleep until a signal writes it (EINTR: the signal came first).
    let mut buf = [0u8; 8];
    loop {
        // SAFETY: `buf` is 8 writable bytes; `stop` is open for the call.
        let n = unsafe { libc::read(stop.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    tracing::info!("tentd: stopping");
    drop(daemon);
    Ok(())
}
