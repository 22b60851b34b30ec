//! Parsing the lines the bench guest prints on COM1.

use thiserror::Error;

/// One `EXITLESS RESULT ...` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestResult {
    pub case: String,
    pub cpl: u8,
    pub iters: u64,
    /// Guest TSC cycles for the measured loop.
    pub cycles: u64,
    /// Guest TSC cycles for the same loop without the exiting instruction.
    pub empty: u64,
    /// Self-IPIs the guest's handler saw during the loop.
    pub ipis: u64,
    /// #UD exceptions the guest skipped during the loop.
    pub uds: u64,
    /// Queue notifications the guest's virtio driver sent (virtio cases only).
    pub notifies: Option<u64>,
    /// Requests the device answered with an error status (virtio cases only).
    pub io_errors: Option<u64>,
}

/// A line the guest printed, as exitless understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestLine {
    Start,
    Result(GuestResult),
    Skip {
        case: String,
        reason: String,
    },
    Error(String),
    Done,
    /// Anything else (kept for the log).
    Other(String),
}

/// Errors parsing a line that claims to be a result.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("Result line lacks '{0}': {1}")]
    Missing(&'static str, String),
    #[error("Result line has a bad value for '{0}': {1}")]
    BadValue(&'static str, String),
}

fn field<'a>(line: &'a str, key: &'static str) -> Result<&'a str, ParseError> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .ok_or_else(|| ParseError::Missing(key, line.to_string()))
}

fn number<T: std::str::FromStr>(line: &str, key: &'static str) -> Result<T, ParseError> {
    field(line, key)?
        .parse()
        .map_err(|_| ParseError::BadValue(key, line.to_string()))
}

/// A field only some cases print: None when absent, an error when malformed.
fn optional<T: std::str::FromStr>(line: &str, key: &'static str) -> Result<Option<T>, ParseError> {
    match field(line, key) {
        Ok(_) => number(line, key).map(Some),
        Err(_) => Ok(None),
    }
}

/// Parses one line of guest output.
pub fn parse_line(line: &str) -> Result<GuestLine, ParseError> {
    let line = line.trim_end_matches(['\r', '\n']);
    let Some(rest) = line.strip_prefix("EXITLESS ") else {
        return Ok(GuestLine::Other(line.to_string()));
    };
    let kind = rest.split_whitespace().next().unwrap_or("");
    Ok(match kind {
        "START" => GuestLine::Start,
        "DONE" => GuestLine::Done,
        "ERROR" => GuestLine::Error(rest["ERROR".len()..].trim().to_string()),
        "SKIP" => GuestLine::Skip {
            case: field(line, "case")?.to_string(),
            reason: field(line, "reason")?.to_string(),
        },
        "RESULT" => GuestLine::Result(GuestResult {
            case: field(line, "case")?.to_string(),
            cpl: number(line, "cpl")?,
            iters: number(line, "iters")?,
            cycles: number(line, "cycles")?,
            empty: number(line, "empty")?,
            ipis: number(line, "ipis")?,
            uds: number(line, "uds")?,
            notifies: optional(line, "notifies")?,
            io_errors: optional(line, "io_errors")?,
        }),
        _ => GuestLine::Other(line.to_string()),
    })
}

impl GuestResult {
    /// Guest cycles per iteration with the empty loop subtracted (never negative).
    pub fn cycles_per_iter(&self) -> f64 {
        self.cycles.saturating_sub(self.empty) as f64 / self.iters.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_result_line() {
        let l = "EXITLESS RESULT case=pio_out cpl=3 iters=1000 cycles=120000 empty=2000 ipis=0 uds=0\r\n";
        let GuestLine::Result(r) = parse_line(l).unwrap() else {
            panic!("not a result")
        };
        assert_eq!(
            (r.case.as_str(), r.cpl, r.iters, r.cycles, r.empty),
            ("pio_out", 3, 1000, 120000, 2000)
        );
        assert_eq!(r.cycles_per_iter(), 118.0);
        assert_eq!((r.notifies, r.io_errors), (None, None));
        let l = "EXITLESS RESULT case=virtio_blk cpl=3 iters=10 cycles=9 empty=1 ipis=2 uds=0 qd=4 notifies=3 io_errors=0";
        let GuestLine::Result(r) = parse_line(l).unwrap() else {
            panic!("not a result")
        };
        assert_eq!((r.notifies, r.io_errors), (Some(3), Some(0)));
        let bad = l.replace("notifies=3", "notifies=x");
        assert_eq!(
            parse_line(&bad),
            Err(ParseError::BadValue("notifies", bad.clone()))
        );
    }

    #[test]
    fn parses_control_lines() {
        assert_eq!(
            parse_line("EXITLESS START version=1").unwrap(),
            GuestLine::Start
        );
        assert_eq!(parse_line("EXITLESS DONE").unwrap(), GuestLine::Done);
        assert_eq!(
            parse_line("EXITLESS SKIP case=hlt reason=lapic-present").unwrap(),
            GuestLine::Skip {
                case: "hlt".into(),
                reason: "lapic-present".into()
            }
        );
        assert_eq!(
            parse_line("EXITLESS ERROR exception vector=13").unwrap(),
            GuestLine::Error("exception vector=13".into())
        );
        assert_eq!(
            parse_line("hello").unwrap(),
            GuestLine::Other("hello".into())
        );
    }

    #[test]
    fn rejects_broken_result_lines() {
        assert!(matches!(
            parse_line("EXITLESS RESULT case=x cpl=3 iters=10 cycles=5 empty=1 ipis=0"),
            Err(ParseError::Missing("uds", _))
        ));
        assert!(matches!(
            parse_line("EXITLESS RESULT case=x cpl=3 iters=ten cycles=5 empty=1 ipis=0 uds=0"),
            Err(ParseError::BadValue("iters", _))
        ));
    }

    #[test]
    fn empty_loop_longer_than_loop_gives_zero() {
        let r = GuestResult {
            case: "x".into(),
            cpl: 0,
            iters: 10,
            cycles: 5,
            empty: 9,
            ipis: 0,
            uds: 0,
            notifies: None,
            io_errors: None,
        };
        assert_eq!(r.cycles_per_iter(), 0.0);
    }
}
