//! A seccomp filter's BPF program shaped as a binary search over the allowed system call
//! numbers, instead of the one comparison per call in a row that `seccompiler` builds.
//!
//! Installing a filter, the kernel runs it once for every system call number to find the
//! calls it always allows (seccomp's action cache: those then skip the filter). Down a row,
//! each of the ~460 numbers, most of them not listed, walks the whole program: installing a
//! 165-instruction row took 0.25-0.35 ms of kernel time on this host, the devices thread's
//! 297 instructions 0.3-0.5 ms, three of them on every `exitless run` while the VM starts on
//! 2 CPUs. Down a tree each number takes ~15 steps: 0.04-0.06 ms for the same length. What
//! a call is allowed to do is the same (a unit test compares both programs' verdicts for
//! every number), and the exit path is not touched: KVM_RUN's `ioctl` is always allowed, so
//! the cache lets it past without running the filter either way.
//!
//! The programs are built when exitless is compiled ([`Rules`] and [`Program`] are `const`):
//! a thread installing its filter only hands the kernel a static array, with no list merged,
//! sorted or compiled and no allocation on the way. The tests run the same `const` functions
//! at run time, and `seccomp.rs`'s tests check every kind's verdicts against `seccompiler`'s
//! program from the same lists.

use seccompiler::sock_filter;

/// What a listed call needs besides its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Allowed {
    /// Any arguments.
    Always,
    /// Its first argument's low 32 bits equal this (`socket(AF_UNIX, ...)`).
    FirstArgIs(u32),
}

// Classic BPF opcodes (linux/bpf_common.h: class | size | mode, class | op | source) and
// seccomp's layout and actions (linux/seccomp.h, linux/audit.h).
/// BPF_LD | BPF_W | BPF_ABS.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG0: u32 = 16;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
pub(super) const RET_ALLOW: u32 = 0x7fff_0000;
pub(super) const RET_TRAP: u32 = 0x0003_0000;
pub(super) const RET_KILL_PROCESS: u32 = 0x8000_0000;

/// Calls a leaf compares one by one; more are split in two.
const LEAF_CALLS: usize = 3;

const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The most calls a thread kind may list (the devices thread lists ~60).
const MAX_RULES: usize = 128;
/// The longest program (BPF allows 4096; the devices thread's is ~190).
const MAX_PROGRAM: usize = 512;

/// A thread kind's calls, sorted by number, each once, with what each needs: built in
/// `const` context from the lists.
#[derive(Clone, Copy)]
pub(super) struct Rules {
    calls: [(u32, Allowed); MAX_RULES],
    len: usize,
}

impl Rules {
    pub(super) const fn new() -> Self {
        Rules {
            calls: [(0, Allowed::Always); MAX_RULES],
            len: 0,
        }
    }

    /// Where `nr` is or would go, and whether it is there.
    const fn find(&self, nr: u32) -> (usize, bool) {
        let mut i = 0;
        while i < self.len && self.calls[i].0 < nr {
            i += 1;
        }
        (i, i < self.len && self.calls[i].0 == nr)
    }

    /// `nr` allowed with any arguments, unless it is listed already (a condition stays).
    pub(super) const fn allow(mut self, nr: libc::c_long) -> Self {
        let nr = nr as u32;
        let (at, listed) = self.find(nr);
        if !listed {
            self = self.insert(at, (nr, Allowed::Always));
        }
        self
    }

    pub(super) const fn allow_all(mut self, calls: &[libc::c_long]) -> Self {
        let mut i = 0;
        while i < calls.len() {
            self = self.allow(calls[i]);
            i += 1;
        }
        self
    }

    /// `nr` allowed only with its first argument's low 32 bits equal to `value`, whether or
    /// not it was listed without a condition.
    pub(super) const fn allow_if_first_arg(mut self, nr: libc::c_long, value: u32) -> Self {
        let nr = nr as u32;
        let (at, listed) = self.find(nr);
        if listed {
            self.calls[at].1 = Allowed::FirstArgIs(value);
        } else {
            self = self.insert(at, (nr, Allowed::FirstArgIs(value)));
        }
        self
    }

    const fn insert(mut self, at: usize, rule: (u32, Allowed)) -> Self {
        assert!(self.len < MAX_RULES, "a seccomp list longer than MAX_RULES");
        let mut i = self.len;
        while i > at {
            self.calls[i] = self.calls[i - 1];
            i -= 1;
        }
        self.calls[at] = rule;
        self.len += 1;
        self
    }

    /// The calls, sorted by number.
    pub(super) const fn calls(&self) -> &[(u32, Allowed)] {
        self.calls.split_at(self.len).0
    }
}

/// A program being built in `const` context; [`Program::code`] is the finished array.
pub(super) struct Program {
    code: [sock_filter; MAX_PROGRAM],
    len: usize,
}

const NO_INSTRUCTION: sock_filter = stmt(0, 0);

impl Program {
    /// The program allowing `rules`' calls and trapping every other call; another
    /// architecture's call kills the process (as `seccompiler` does). A program too long for
    /// BPF's 8-bit jumps stops the compilation of exitless.
    pub(super) const fn compile(rules: &Rules) -> Program {
        let mut p = Program {
            code: [NO_INSTRUCTION; MAX_PROGRAM],
            len: 0,
        };
        p.push(stmt(BPF_LD_W_ABS, DATA_ARCH));
        p.push(jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0));
        p.push(stmt(BPF_RET_K, RET_KILL_PROCESS));
        p.push(stmt(BPF_LD_W_ABS, DATA_NR));
        p.node(rules.calls());
        p
    }

    pub(super) const fn len(&self) -> usize {
        self.len
    }

    /// The instructions, as an array of their exact number (`N`: [`Program::len`]).
    pub(super) const fn code<const N: usize>(&self) -> [sock_filter; N] {
        assert!(N == self.len);
        let mut out = [NO_INSTRUCTION; N];
        let mut i = 0;
        while i < N {
            let f = &self.code[i];
            out[i] = jump(f.code, f.k, f.jt, f.jf);
            i += 1;
        }
        out
    }

    const fn push(&mut self, f: sock_filter) {
        assert!(
            self.len < MAX_PROGRAM,
            "a seccomp program longer than MAX_PROGRAM"
        );
        self.code[self.len] = f;
        self.len += 1;
    }

    /// The code deciding `calls` (sorted), the call number loaded: a leaf of up to
    /// [`LEAF_CALLS`] comparisons, else a jump over the lower half's code to the upper half's;
    /// every path ends in a return.
    const fn node(&mut self, calls: &[(u32, Allowed)]) {
        if calls.len() <= LEAF_CALLS {
            self.leaf(calls);
            return;
        }
        let (below, from) = calls.split_at(calls.len() / 2);
        let at = self.len;
        self.push(jump(BPF_JGE_K, from[0].0, 0, 0));
        self.node(below);
        let skip = self.len - at - 1;
        assert!(
            skip <= u8::MAX as usize,
            "a seccomp program too long for BPF's jumps"
        );
        self.code[at].jt = skip as u8;
        self.node(from);
    }

    /// One comparison per call, then a trap. A condition's argument replaces the number in
    /// the accumulator: whatever it holds, that call's path ends there.
    const fn leaf(&mut self, calls: &[(u32, Allowed)]) {
        let mut i = 0;
        while i < calls.len() {
            let nr = calls[i].0;
            match calls[i].1 {
                Allowed::Always => {
                    self.push(jump(BPF_JEQ_K, nr, 0, 1));
                    self.push(stmt(BPF_RET_K, RET_ALLOW));
                }
                Allowed::FirstArgIs(value) => {
                    self.push(jump(BPF_JEQ_K, nr, 0, 4));
                    self.push(stmt(BPF_LD_W_ABS, DATA_ARG0));
                    self.push(jump(BPF_JEQ_K, value, 0, 1));
                    self.push(stmt(BPF_RET_K, RET_ALLOW));
                    self.push(stmt(BPF_RET_K, RET_TRAP));
                }
            }
            i += 1;
        }
        self.push(stmt(BPF_RET_K, RET_TRAP));
    }
}

/// Runs `program` on a call as the kernel would (the instructions this module and
/// `seccompiler` emit): its action and how many instructions it took.
#[cfg(test)]
pub(super) fn run(program: &[sock_filter], arch: u32, nr: u32, arg0: u64) -> (u32, usize) {
    const BPF_JA: u16 = 0x05;
    const BPF_JGT_K: u16 = 0x05 | 0x20;
    const BPF_JSET_K: u16 = 0x05 | 0x40;
    const BPF_AND_K: u16 = 0x04 | 0x50;
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    data[16..24].copy_from_slice(&arg0.to_le_bytes());
    let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
    loop {
        let i = &program[pc];
        steps += 1;
        pc += 1;
        let taken = |cond: bool| usize::from(if cond { i.jt } else { i.jf });
        match i.code {
            BPF_LD_W_ABS => {
                let at = i.k as usize;
                acc = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
            }
            BPF_RET_K => return (i.k, steps),
            BPF_JA => pc += i.k as usize,
            BPF_JEQ_K => pc += taken(acc == i.k),
            BPF_JGE_K => pc += taken(acc >= i.k),
            BPF_JGT_K => pc += taken(acc > i.k),
            BPF_JSET_K => pc += taken(acc & i.k != 0),
            BPF_AND_K => acc &= i.k,
            code => panic!("instruction {code:#x} at {} not interpreted", pc - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules the tests compile: 60 calls out of order and twice, and a condition put on a
    /// call listed without one.
    fn sixty_calls_and_one_condition() -> Rules {
        let mut rules = Rules::new();
        for i in (0..60).rev().chain(0..60) {
            rules = rules.allow(i * 7 + 1);
        }
        rules.allow(1000).allow_if_first_arg(1000, 1).allow(1000)
    }

    fn compiled(rules: &Rules) -> Vec<sock_filter> {
        let p = Program::compile(rules);
        p.code[..p.len()].to_vec()
    }

    #[test]
    fn rules_are_sorted_listed_once_and_keep_a_condition() {
        let calls: Vec<(u32, Allowed)> = (0..60u32)
            .map(|i| (i * 7 + 1, Allowed::Always))
            .chain([(1000, Allowed::FirstArgIs(1))])
            .collect();
        assert_eq!(sixty_calls_and_one_condition().calls(), &calls[..]);
    }

    #[test]
    fn listed_calls_pass_others_trap_and_paths_stay_short() {
        let p = compiled(&sixty_calls_and_one_condition());
        let mut longest = 0;
        for nr in 0..1100u32 {
            let (action, steps) = run(&p, AUDIT_ARCH_X86_64, nr, 0);
            let listed = nr < 420 && nr % 7 == 1;
            let expected = if listed { RET_ALLOW } else { RET_TRAP };
            assert_eq!(action, expected, "call {nr}");
            longest = longest.max(steps);
        }
        // 4 to check the architecture and load the number, 5 levels of 61 calls, a leaf.
        assert!(longest <= 4 + 5 + 2 * LEAF_CALLS + 3, "{longest} steps");
        assert_eq!(run(&p, AUDIT_ARCH_X86_64, 1000, 1).0, RET_ALLOW);
        assert_eq!(run(&p, AUDIT_ARCH_X86_64, 1000, 2).0, RET_TRAP);
        // Only the low 32 bits count, as seccompiler's Dword comparison.
        assert_eq!(run(&p, AUDIT_ARCH_X86_64, 1000, 1 << 32 | 1).0, RET_ALLOW);
        assert_eq!(run(&p, 0x4000_0003, 8, 0).0, RET_KILL_PROCESS);
        // x32 calls (bit 30 set) and numbers beyond any list trap.
        assert_eq!(run(&p, AUDIT_ARCH_X86_64, 0x4000_0008, 0).0, RET_TRAP);
        assert_eq!(run(&p, AUDIT_ARCH_X86_64, u32::MAX, 0).0, RET_TRAP);
    }

    #[test]
    fn no_calls_trap_everything() {
        let code: [sock_filter; 5] = Program::compile(&Rules::new()).code();
        assert_eq!(run(&code, AUDIT_ARCH_X86_64, 0, 0).0, RET_TRAP);
        assert_eq!(run(&code, AUDIT_ARCH_X86_64, 1000, 0).0, RET_TRAP);
    }

    /// A list longer than a program may hold stops the compilation (in `const` context,
    /// exitless's build).
    #[test]
    #[should_panic(expected = "longer than MAX_RULES")]
    fn too_many_calls_are_refused() {
        let mut rules = Rules::new();
        for nr in 0..=MAX_RULES as libc::c_long {
            rules = rules.allow(nr);
        }
    }
}
