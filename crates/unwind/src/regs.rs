//! The x86-64 general-purpose registers of one frame, each known or unknown, in DWARF numbering.
//!
//! A sample carries all of them (perf's `sample_regs_user`); unwinding a frame keeps the ones its
//! CFI restores or leaves untouched and forgets the rest, so a rule that needs a register nobody
//! can vouch for ends the stack explicitly instead of using a stale value.

/// Number of tracked registers: DWARF 0–15 (the general-purpose registers) and 16 (rip).
pub const COUNT: usize = 17;

/// DWARF number of `rax`.
pub const RAX: u16 = 0;
/// DWARF number of `rdx`.
pub const RDX: u16 = 1;
/// DWARF number of `rcx`.
pub const RCX: u16 = 2;
/// DWARF number of `rbx`.
pub const RBX: u16 = 3;
/// DWARF number of `rsi`.
pub const RSI: u16 = 4;
/// DWARF number of `rdi`.
pub const RDI: u16 = 5;
/// DWARF number of `rbp`.
pub const RBP: u16 = 6;
/// DWARF number of `rsp`.
pub const RSP: u16 = 7;
/// DWARF number of `r8` (`r9`–`r15` follow).
pub const R8: u16 = 8;
/// DWARF number of `r12` (`r13`–`r15` follow).
pub const R12: u16 = 12;
/// DWARF number of `r13`.
pub const R13: u16 = 13;
/// DWARF number of the return address column (`rip`).
pub const RIP: u16 = 16;

/// Whether the SysV x86-64 ABI makes a register callee-saved: a function that does not save it
/// (no CFI rule) leaves its caller's value in it.
pub fn callee_saved(reg: u16) -> bool {
    matches!(reg, RBX | RBP | 12..=15)
}

/// The perf `sample_regs_user` bit of each DWARF register 0–16 (`arch/x86/include/uapi/asm/
/// perf_regs.h`: AX BX CX DX SI DI BP SP IP FLAGS CS SS DS ES FS GS R8 … R15).
pub const PERF_BIT: [u8; COUNT] = [
    0,  // rax
    3,  // rdx
    2,  // rcx
    1,  // rbx
    4,  // rsi
    5,  // rdi
    6,  // rbp
    7,  // rsp
    16, // r8
    17, // r9
    18, // r10
    19, // r11
    20, // r12
    21, // r13
    22, // r14
    23, // r15
    8,  // rip
];

/// The `sample_regs_user` mask requesting every register in [`PERF_BIT`].
pub const PERF_MASK: u64 = {
    let mut mask = 0u64;
    let mut i = 0;
    while i < COUNT {
        mask |= 1 << PERF_BIT[i];
        i += 1;
    }
    mask
};

/// Register values of one frame; each may be unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registers {
    values: [u64; COUNT],
    known: u32,
}

impl Registers {
    /// Only the instruction pointer, stack pointer and frame pointer are known.
    pub fn new(ip: u64, sp: u64, bp: u64) -> Registers {
        let mut r = Registers {
            values: [0; COUNT],
            known: 0,
        };
        r.set(RIP, ip);
        r.set(RSP, sp);
        r.set(RBP, bp);
        r
    }

    /// All registers, from the values perf records for [`PERF_MASK`] (in increasing perf bit
    /// order). None when fewer values are given.
    pub fn from_perf(values: &[u64]) -> Option<Registers> {
        let mut order: [(u8, u16); COUNT] = [(0, 0); COUNT];
        for (reg, slot) in order.iter_mut().enumerate() {
            *slot = (PERF_BIT[reg], reg as u16);
        }
        order.sort_unstable();
        let mut r = Registers::new(0, 0, 0);
        for (i, &(_, reg)) in order.iter().enumerate() {
            r.set(reg, *values.get(i)?);
        }
        Some(r)
    }

    /// The value of DWARF register `reg`, when known.
    pub fn get(&self, reg: u16) -> Option<u64> {
        let i = usize::from(reg);
        (i < COUNT && self.known & (1 << i) != 0).then(|| self.values[i])
    }

    /// Sets DWARF register `reg` (ignored beyond [`COUNT`]).
    pub fn set(&mut self, reg: u16, value: u64) {
        let i = usize::from(reg);
        if i < COUNT {
            self.values[i] = value;
            self.known |= 1 << i;
        }
    }

    /// Marks DWARF register `reg` unknown.
    pub fn forget(&mut self, reg: u16) {
        if usize::from(reg) < COUNT {
            self.known &= !(1 << reg);
        }
    }

    /// The instruction pointer (0 when unknown).
    pub fn ip(&self) -> u64 {
        self.values[usize::from(RIP)]
    }

    /// The stack pointer (0 when unknown).
    pub fn sp(&self) -> u64 {
        self.values[usize::from(RSP)]
    }

    /// The frame pointer's value, whether or not it is known to be the frame's.
    pub fn bp(&self) -> u64 {
        self.values[usize::from(RBP)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_values_land_in_dwarf_numbering() {
        // perf order: AX BX CX DX SI DI BP SP IP R8..R15.
        let values: Vec<u64> = (100..117).collect();
        let r = Registers::from_perf(&values).expect("17 values");
        assert_eq!(r.get(RAX), Some(100));
        assert_eq!(r.get(RBX), Some(101));
        assert_eq!(r.get(RCX), Some(102));
        assert_eq!(r.get(RDX), Some(103));
        assert_eq!(r.get(RSI), Some(104));
        assert_eq!(r.get(RDI), Some(105));
        assert_eq!(r.get(RBP), Some(106));
        assert_eq!(r.get(RSP), Some(107));
        assert_eq!(r.get(RIP), Some(108));
        assert_eq!(r.get(R8), Some(109));
        assert_eq!(r.get(15), Some(116));
        assert!(Registers::from_perf(&values[..16]).is_none());
        assert_eq!(PERF_MASK, 0x00ff_01ff);
    }

    #[test]
    fn forgotten_registers_are_unknown() {
        let mut r = Registers::new(1, 2, 3);
        assert_eq!(r.get(RBX), None);
        r.set(RBX, 9);
        assert_eq!(r.get(RBX), Some(9));
        r.forget(RBX);
        assert_eq!(r.get(RBX), None);
        assert_eq!(r.get(99), None);
        assert!(callee_saved(RBX) && callee_saved(15) && !callee_saved(RAX));
    }
}
