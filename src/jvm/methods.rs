//! Java method names from a JVM's `Method*`: its class's name and its own,
//! from the symbols of the class's constant pool.

use super::vmstructs::Vm;
use crate::process::remote::Remote;

/// Longest symbol read (class and method names are far shorter).
const MAX_SYMBOL: u64 = 4096;

/// `pkg.Class.method` for `method`, with hidden-class and lambda names
/// made stable ([`crate::perfmap::names::stable_name`]); `None` when what is there
/// does not read as a method (freed, or not a `Method*` at all).
pub fn method_name(vm: &Vm, mem: &Remote, method: u64) -> Option<String> {
    let l = &vm.layout;
    let cmethod = l.method_const.read(mem, method).ok()?;
    let pool = l.const_constants.read(mem, cmethod).ok()?;
    let name_index = l.const_name_index.read(mem, cmethod).ok()?;
    let holder = l.pool_holder.read(mem, pool).ok()?;
    let class = symbol(vm, mem, l.klass_name.read(mem, holder).ok()?)?;
    let name = pool_symbol(vm, mem, pool, name_index)?;
    Some(crate::perfmap::names::stable_name(&format!(
        "{}.{name}",
        class.replace('/', ".")
    )))
}

/// The symbol at index `index` of the constant pool at `pool`: its
/// entries follow the pool's header, one word each.
fn pool_symbol(vm: &Vm, mem: &Remote, pool: u64, index: u64) -> Option<String> {
    if index == 0 || index > u64::from(u16::MAX) {
        return None;
    }
    let entry = mem.u64(pool + vm.layout.pool_size + 8 * index).ok()?;
    // The low bit tags resolved entries in some versions.
    symbol(vm, mem, entry & !1)
}

/// The text of the `Symbol` at `addr`, if it is a plausible Java name.
fn symbol(vm: &Vm, mem: &Remote, addr: u64) -> Option<String> {
    let l = &vm.layout;
    let len = l.symbol_length.read(mem, addr).ok()?;
    if len == 0 || len > MAX_SYMBOL {
        return None;
    }
    let bytes = mem.bytes(addr + l.symbol_body, len as usize).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    text.chars()
        .all(|c| !c.is_control() && c != ';' && c != ' ')
        .then_some(text)
}
