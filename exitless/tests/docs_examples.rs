//! The documentation cannot rot: every `--help` describes each of its options, commands and
//! arguments once, and every command in the `sh` blocks of README.md and docs/*.md runs here
//! and succeeds (the few that cannot are listed in [`SKIPS`] with why).
//!
//! Each document's commands run in order in one bash, in a scratch directory that stands for
//! /tmp (paths under /tmp/ are rewritten into it), with `exitless` on PATH being the binary
//! under test, each under a time limit; `K` (any kernel) is the bench guest, exported there
//! first. Bench runs take small iteration counts (as the docs allow: `--iterations`).
//! Commands ending in `&` start a session in the background (its API socket is waited for)
//! and are stopped when the document ends.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// Commands that cannot run here, by a piece of their text, and why.
const SKIPS: &[(&str, &str)] = &[
    (
        "cargo ",
        "builds and fuzzing: this test runs inside the build (fuzz runs take hours)",
    ),
    ("cd fuzz", "fuzzing: cargo +nightly fuzz runs for hours"),
    (
        "scripts/",
        "the whole suite and the Linux guest's download: this test is part of the suite",
    ),
    (
        "guest/vmlinux",
        "a Linux guest: downloaded by scripts/fetch-guest.sh, and PVM cannot boot it",
    ),
    (
        "--kernel vmlinux",
        "a Linux guest (and a virtiofsd of the reader's own)",
    ),
    (
        "/srv/share",
        "the reader's own shared directory (tests/vhost_fs.rs runs virtiofsd)",
    ),
    (
        "exitless compare",
        "peer VMMs and minutes of rounds: exitless/tests/compare.rs runs compare",
    ),
    (
        "qemu-system-x86_64",
        "a peer VMM: tests/guest_portability.rs boots the guest in QEMU",
    ),
    (
        "ip tuntap",
        "a tap on the host's network (tests/net.rs uses a private namespace)",
    ),
    (
        "--net tap=",
        "a tap on the host's network (tests/net.rs uses a private namespace)",
    ),
    (
        "socat",
        "vsock's session: someone types into the guest from a second terminal",
    ),
    (
        "case=vsock_check",
        "vsock's session: it waits for the socat peer above",
    ),
    ("<pid>", "a placeholder for a running VM's process id"),
    (
        "floor [",
        "a synopsis of the floor's arguments, not a command",
    ),
    (
        "vm.json",
        "the reader's own VmConfig (docs/api.md's session writes one inline)",
    ),
];
/// How long one command may take.
const LIMIT: Duration = Duration::from_secs(150);
/// Iterations a bench run is given here (the IPI family's VMs are slow under PVM: fewer).
const BENCH_ITERATIONS: &str = "200";
const IPI_ITERATIONS: &str = "20";
/// Rounds the dirty-tracking family is given here (`--iterations` is its rounds, 2 to 64).
const DIRTY_ROUNDS: &str = "3";

/// The commands of `text`'s ```sh blocks: continuation lines joined, comments and blank
/// lines dropped, a quoted argument spanning lines kept whole.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for block in text.split("```sh\n").skip(1) {
        let block = block.split("```").next().unwrap_or("");
        let mut current = String::new();
        for line in block.lines() {
            current.push_str(line);
            if quotes_open(&current) {
                current.push('\n');
                continue;
            }
            if let Some(head) = current.strip_suffix('\\') {
                current = format!("{head} ");
                continue;
            }
            let command = strip_comment(&current).trim().to_string();
            if !command.is_empty() {
                out.push(command);
            }
            current.clear();
        }
    }
    out
}

/// Where a shell line's comment starts (a `#` starting a word outside quotes), and whether a
/// quote is still open at its end (the argument goes on on the next line).
fn scan(line: &str) -> (Option<usize>, bool) {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '#') if prev.is_whitespace() => return (Some(i), false),
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            _ => {}
        }
        prev = c;
    }
    (None, quote.is_some())
}

fn quotes_open(s: &str) -> bool {
    scan(s).1
}

/// `line` without a trailing `# comment`.
fn strip_comment(line: &str) -> &str {
    match scan(line).0 {
        Some(at) => &line[..at],
        None => line,
    }
}

/// Why `command` is not run, if it is not.
fn skipped(command: &str) -> Option<&'static str> {
    SKIPS
        .iter()
        .find(|(text, _)| command.contains(text))
        .map(|(_, why)| *why)
}

/// The API socket a command talks to or serves (`--api-socket P` or curl's `--unix-socket P`).
fn socket_of(command: &str) -> Option<&str> {
    let words: Vec<&str> = command.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == "--api-socket" || w[0] == "--unix-socket")
        .map(|w| w[1].trim_matches('"'))
}

/// `command` as run here: /tmp is `scratch`, `K` the bench guest, bench runs short, the
/// snapshot guest's rounds few.
fn adapt(command: &str, scratch: &Path) -> String {
    let words: Vec<String> = command
        .split(' ')
        .map(|w| match w.strip_prefix("/tmp") {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                format!("{}{rest}", scratch.display())
            }
            _ => w.replace("/tmp/", &format!("{}/", scratch.display())),
        })
        .map(|w| match w.strip_prefix("ticks=") {
            Some(n) => format!(
                "ticks=3{}",
                n.trim_start_matches(|c: char| c.is_ascii_digit())
            ),
            None => w,
        })
        .collect();
    let mut c = words.join(" ");
    c = c.replace("--kernel K ", "--kernel bench.elf ");
    let bench = c.starts_with("exitless bench") || c.starts_with("exitless --seccomp");
    let measures = ["--help", "--list", "--export-", "--false-sharing"]
        .iter()
        .all(|o| !c.contains(o));
    if bench && measures {
        let n = if c.contains("--ipi") {
            IPI_ITERATIONS
        } else if c.contains("--dirty") {
            DIRTY_ROUNDS
        } else {
            BENCH_ITERATIONS
        };
        let words: Vec<String> = c.split(' ').map(String::from).collect();
        let mut kept = Vec::new();
        let mut skip_next = false;
        for w in words {
            if std::mem::take(&mut skip_next) {
                continue;
            }
            skip_next = w == "--iterations";
            if !skip_next {
                kept.push(w);
            }
        }
        c = format!("{} --iterations {n}", kept.join(" "));
    }
    c
}

/// One bash, fed commands one at a time; each command's output goes to a file of its own.
struct Shell {
    child: Child,
    stdin: std::process::ChildStdin,
    done: Receiver<String>,
    scratch: PathBuf,
    count: usize,
}

impl Shell {
    fn start(scratch: &Path, bin_dir: &Path) -> Shell {
        use std::os::unix::process::CommandExt;
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new("bash")
            .current_dir(scratch)
            .env("PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, done) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Shell {
            child,
            stdin,
            done,
            scratch: scratch.to_path_buf(),
            count: 0,
        }
    }

    /// Runs `command`; Err says how it failed, with its output.
    fn run(&mut self, command: &str) -> Result<(), String> {
        self.count += 1;
        let out = self.scratch.join(format!(".out{}", self.count));
        let script = match command.strip_suffix('&') {
            Some(background) => {
                let wait = socket_of(background).map_or(String::new(), |s| {
                    format!("for i in $(seq 200); do [ -S {s} ] && break; sleep 0.05; done; ")
                });
                format!(
                    "( {background} ) > {} 2>&1 < /dev/null & {wait}echo @@rc=0\n",
                    out.display()
                )
            }
            None => format!(
                "{{ {command}\n}} > {} 2>&1 < /dev/null; echo @@rc=$?\n",
                out.display()
            ),
        };
        self.stdin.write_all(script.as_bytes()).unwrap();
        let output = || std::fs::read_to_string(&out).unwrap_or_default();
        match self.done.recv_timeout(LIMIT) {
            Ok(line) if line == "@@rc=0" => Ok(()),
            Ok(line) => Err(format!("{line}\n{}", output())),
            Err(_) => Err(format!("did not end within {LIMIT:?}\n{}", output())),
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // The shell and what it started in the background (one process group).
        let group = -(self.child.id() as i32);
        // SAFETY: kill sends signals to a process group this test started; no memory.
        unsafe {
            libc::kill(group, libc::SIGTERM);
        }
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: as above.
        unsafe {
            libc::kill(group, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Runs `doc`'s commands; returns the failures, and counts the commands run and skipped.
fn run_document(doc: &Path, bin_dir: &Path, counts: &mut (usize, usize)) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap();
    let name = doc.file_name().unwrap().to_string_lossy().into_owned();
    let scratch = std::env::temp_dir().join(format!("exitless-docs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let mut shell = Shell::start(&scratch, bin_dir);
    let mut failures = Vec::new();
    // Sessions (API sockets) a skipped or failed command belonged to: the rest of each is
    // skipped too.
    let mut lost_sessions: Vec<String> = Vec::new();
    let prelude = "exitless bench --export-guest bench.elf";
    if let Err(e) = shell.run(prelude) {
        return vec![format!("{name}: {prelude}: {e}")];
    }
    for command in commands(&text) {
        let session = socket_of(&command).map(String::from);
        let lost = session.as_ref().is_some_and(|s| lost_sessions.contains(s));
        if lost || skipped(&command).is_some() {
            lost_sessions.extend(session);
            counts.1 += 1;
            continue;
        }
        counts.0 += 1;
        if let Err(e) = shell.run(&adapt(&command, &scratch)) {
            failures.push(format!("{name}: `{command}` failed: {e}"));
            lost_sessions.extend(session);
        }
    }
    drop(shell);
    let _ = std::fs::remove_dir_all(&scratch);
    failures
}

/// README.md and docs/*.md.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

#[test]
fn every_command_in_the_readme_and_docs_runs() {
    const TEST: &str = "docs_examples_run";
    if !common::kvm_available(TEST) {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return vmm::test_skip::skip(TEST, "the examples are written for root (seccomp, taps)");
    }
    let bin_dir = std::env::temp_dir().join(format!("exitless-docs-bin-{}", std::process::id()));
    std::fs::create_dir_all(&bin_dir).unwrap();
    let link = bin_dir.join("exitless");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(common::exitless_path(), &link).unwrap();
    let mut counts = (0, 0);
    let failures: Vec<String> = documents()
        .iter()
        .flat_map(|doc| run_document(doc, &bin_dir, &mut counts))
        .collect();
    let _ = std::fs::remove_dir_all(&bin_dir);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Most commands run (43 of 77 on 2026-11-28): the skips stay the exception.
    assert!(
        counts.0 > counts.1,
        "run {}, skipped {}",
        counts.0,
        counts.1
    );
}

#[test]
fn the_skip_list_is_needed_and_the_parser_sees_every_command() {
    let all: Vec<String> = documents()
        .iter()
        .flat_map(|d| commands(&std::fs::read_to_string(d).unwrap()))
        .collect();
    for (text, why) in SKIPS {
        assert!(
            all.iter().any(|c| c.contains(text)),
            "no command contains {text:?} any more: drop its skip ({why})"
        );
    }
    let md = "```sh\na \\\n  b   # c\ncurl -d '{\n \"x\": 1}'   # d\n# e\nf '#g' &\n```\n";
    assert_eq!(
        commands(md),
        ["a    b", "curl -d '{\n \"x\": 1}'", "f '#g' &"]
    );
    let scratch = Path::new("/s");
    assert_eq!(
        adapt(
            "exitless bench --cases x --iterations 20000 --json /tmp/o",
            scratch
        ),
        "exitless bench --cases x --json /s/o --iterations 200"
    );
    assert_eq!(
        adapt("exitless bench --list", scratch),
        "exitless bench --list"
    );
    assert_eq!(
        adapt(
            "x --export-floor /tmp && /tmp/f \"case=snapshot ticks=30\"",
            scratch
        ),
        "x --export-floor /s && /s/f \"case=snapshot ticks=3\""
    );
    assert_eq!(
        socket_of("curl --unix-socket /tmp/x.sock http://l/"),
        Some("/tmp/x.sock")
    );
}

fn help_of(path: &[&str]) -> String {
    let o = common::exitless()
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success(), "{path:?} --help");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The entries of a help text's `section` ("Options:", "Arguments:", "Commands:"), each with
/// its description (the rest of its line, or the more indented lines under it).
fn entries(help: &str, section: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if !line.starts_with(' ') {
            inside = line == section;
            continue;
        }
        if !inside || line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        match out.last_mut() {
            // A description line under its entry (long help: indented 10).
            Some((_, desc)) if indent >= 10 => {
                desc.push(' ');
                desc.push_str(line.trim());
            }
            _ => {
                let body = line.trim_start();
                let (name, desc) = body.split_once("  ").unwrap_or((body, ""));
                out.push((name.trim().to_string(), desc.trim().to_string()));
            }
        }
    }
    out
}

/// Checks one help text; returns what is wrong in it.
fn help_problems(path: &[&str], help: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for section in ["Options:", "Arguments:", "Commands:"] {
        let found = entries(help, section);
        for (name, desc) in &found {
            if desc.is_empty() {
                problems.push(format!("{path:?}: {name} has no description"));
            }
            // The same note twice (`[default: 30] [default: 30]`: written in the text and
            // added by clap); defaults of several sub-keys are different notes.
            let notes: Vec<&str> = desc
                .split('[')
                .skip(1)
                .filter_map(|n| n.split(']').next())
                .collect();
            for (i, note) in notes.iter().enumerate() {
                if notes[..i].contains(note) {
                    problems.push(format!("{path:?}: {name} says [{note}] twice: {desc}"));
                }
            }
            if found.iter().filter(|(n, _)| n == name).count() > 1 {
                problems.push(format!("{path:?}: {name} is listed twice"));
            }
        }
    }
    problems
}

fn subcommands(help: &str) -> Vec<String> {
    entries(help, "Commands:")
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name != "help")
        .collect()
}

#[test]
fn every_help_text_describes_each_option_once_and_offers_only_what_acts_there() {
    let mut problems = Vec::new();
    let top = help_of(&[]);
    problems.extend(help_problems(&[], &top));
    let mut walked = 0;
    for sub in subcommands(&top) {
        let help = help_of(&[&sub]);
        problems.extend(help_problems(&[&sub], &help));
        walked += 1;
        for inner in subcommands(&help) {
            problems.extend(help_problems(&[&sub, &inner], &help_of(&[&sub, &inner])));
            walked += 1;
        }
        let offers = |flag: &str| help.lines().any(|l| l.trim_start().starts_with(flag));
        let wrong: &[&str] = match sub.as_str() {
            "bench" | "compare" => &["--api-socket", "-v, --verbose"],
            "remote" => &["--seccomp", "-v, --verbose", "--log-file"],
            _ => &[],
        };
        for flag in wrong {
            if offers(flag) {
                problems.push(format!(
                    "{sub} --help offers {flag}, which does not act there"
                ));
            }
        }
    }
    assert!(walked >= 20, "walked {walked} help texts");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
