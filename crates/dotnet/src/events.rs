//! Payloads of the runtime events a CPU/allocation profile needs, decoded by their manifest layout
//! (native runtime events carry no field descriptions in the trace).

use crate::error::NetTraceError;
use crate::nettrace::{Bytes, EventMetadata};

/// Provider of thread samples.
pub const SAMPLE_PROFILER: &str = "Microsoft-DotNETCore-SampleProfiler";
/// The runtime's main provider (JIT, loader, GC events).
pub const RUNTIME: &str = "Microsoft-Windows-DotNETRuntime";
/// The runtime's rundown provider (methods and modules alive when the session stops).
pub const RUNDOWN: &str = "Microsoft-Windows-DotNETRuntimeRundown";
/// EventPipe's own provider (process info).
pub const EVENTPIPE: &str = "Microsoft-DotNETCore-EventPipe";

/// The events this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KnownEvent {
    /// SampleProfiler event 0: a thread sample.
    ThreadSample,
    /// Runtime 143 `MethodLoadVerbose` or 144 `MethodUnloadVerbose`; rundown 143
    /// `MethodDCStartVerbose` or 144 `MethodDCEndVerbose`.
    MethodVerbose,
    /// Runtime 152 `ModuleLoad`, 153 `ModuleUnload`; rundown 153 `ModuleDCStart`, 154 `ModuleDCEnd`.
    Module,
    /// Runtime 10 `GCAllocationTick`.
    AllocationTick,
    /// EventPipe 1 `ProcessInfo` (command line).
    ProcessInfo,
}

impl KnownEvent {
    /// Which known event `m` describes, if any.
    pub fn classify(m: &EventMetadata) -> Option<KnownEvent> {
        match (m.provider.as_str(), m.event_id) {
            (SAMPLE_PROFILER, 0) => Some(KnownEvent::ThreadSample),
            (RUNTIME | RUNDOWN, 143 | 144) => Some(KnownEvent::MethodVerbose),
            (RUNTIME, 152 | 153) | (RUNDOWN, 153 | 154) => Some(KnownEvent::Module),
            (RUNTIME, 10) => Some(KnownEvent::AllocationTick),
            (EVENTPIPE, 1) => Some(KnownEvent::ProcessInfo),
            _ => None,
        }
    }
}

/// A JIT-compiled (or loaded precompiled) method and where its code lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodInfo {
    /// Runtime method id.
    pub method_id: u64,
    /// Runtime module id of the method's module.
    pub module_id: u64,
    /// First code address.
    pub start: u64,
    /// Code size in bytes.
    pub size: u32,
    /// Namespace and type, e.g. `System.Threading.Thread`.
    pub namespace: String,
    /// Method name, e.g. `Sleep`.
    pub name: String,
    /// Signature, e.g. `void  (int32)`.
    pub signature: String,
    /// `MethodFlags`: dynamic, generic, jitted… and, from .NET 5 on, the code tier in bits 7–9
    /// (see [`crate::names::tier_from_method_flags`]).
    pub flags: u32,
}

impl MethodInfo {
    /// `Namespace.Name(params)`, the way dotnet-trace names a method (parameters from the signature).
    pub fn display_name(&self) -> String {
        let params = self
            .signature
            .find('(')
            .map_or("", |i| &self.signature[i..]);
        if self.namespace.is_empty() {
            format!("{}{params}", self.name)
        } else {
            format!("{}.{}{params}", self.namespace, self.name)
        }
    }

    /// The name to show: [`MethodInfo::display_name`], except that an `async` method's or
    /// iterator's `MoveNext` is named as the method the user wrote, `Namespace.Type.Method`
    /// (no parameters: the state machine's `MoveNext` has none of the method's).
    pub fn user_name(&self) -> String {
        if self.name == "MoveNext"
            && let Some(m) = crate::names::state_machine_method(&self.namespace)
        {
            return format!("{}.{}", m.declaring_type, m.method);
        }
        self.display_name()
    }

    /// The code tier the runtime compiled this code at, when the event says.
    pub fn tier(&self) -> Option<&'static str> {
        crate::names::tier_from_method_flags(self.flags)
    }
}

/// A loaded module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Runtime module id.
    pub module_id: u64,
    /// Runtime assembly id.
    pub assembly_id: u64,
    /// Path of the IL image.
    pub il_path: String,
    /// Path of the native image, if any.
    pub native_path: String,
}

impl ModuleInfo {
    /// The module's short name: the file name of its IL (or native) path without the extension.
    pub fn short_name(&self) -> String {
        let path = if self.il_path.is_empty() {
            &self.native_path
        } else {
            &self.il_path
        };
        let file = path.rsplit(['/', '\\']).next().unwrap_or(path);
        let stem = match file.rsplit_once('.') {
            Some((stem, ext))
                if !stem.is_empty()
                    && ["dll", "exe", "ni"].contains(&ext.to_ascii_lowercase().as_str()) =>
            {
                stem
            }
            _ => file,
        };
        stem.to_string()
    }
}

/// A GC allocation tick: about every 100 KB allocated, the allocation that crossed the mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationTick {
    /// Bytes allocated since the previous tick.
    pub amount: u64,
    /// 0 small object heap, 1 large object heap, 2 pinned object heap.
    pub kind: u32,
    /// Type of the object that crossed the mark, when the event version has it.
    pub type_name: Option<String>,
}

/// Decodes a `MethodLoadVerbose`/`MethodDCEndVerbose`-style payload.
pub fn parse_method_verbose(payload: &[u8], offset: u64) -> Result<MethodInfo, NetTraceError> {
    let mut b = Bytes::new(payload, offset);
    let method_id = b.u64("MethodID")?;
    let module_id = b.u64("ModuleID")?;
    let start = b.u64("MethodStartAddress")?;
    let size = b.u32("MethodSize")?;
    b.u32("MethodToken")?;
    let flags = b.u32("MethodFlags")?;
    Ok(MethodInfo {
        method_id,
        module_id,
        start,
        size,
        namespace: b.utf16z("MethodNamespace")?,
        name: b.utf16z("MethodName")?,
        signature: b.utf16z("MethodSignature")?,
        flags,
    })
}

/// Decodes a `ModuleLoad`/`ModuleDCEnd`-style payload.
pub fn parse_module(payload: &[u8], offset: u64) -> Result<ModuleInfo, NetTraceError> {
    let mut b = Bytes::new(payload, offset);
    let module_id = b.u64("ModuleID")?;
    let assembly_id = b.u64("AssemblyID")?;
    b.u32("ModuleFlags")?;
    b.u32("Reserved1")?;
    Ok(ModuleInfo {
        module_id,
        assembly_id,
        il_path: b.utf16z("ModuleILPath")?,
        native_path: b.utf16z("ModuleNativePath")?,
    })
}

/// Decodes a `GCAllocationTick` payload (versions 1–4).
pub fn parse_allocation_tick(
    payload: &[u8],
    offset: u64,
    pointer_size: u8,
) -> Result<AllocationTick, NetTraceError> {
    let mut b = Bytes::new(payload, offset);
    let amount32 = b.u32("AllocationAmount")?;
    let kind = b.u32("AllocationKind")?;
    let mut tick = AllocationTick {
        amount: u64::from(amount32),
        kind,
        type_name: None,
    };
    if b.remaining() >= 2 {
        b.u16("ClrInstanceID")?;
    }
    if b.remaining() >= 8 {
        tick.amount = b.u64("AllocationAmount64")?;
        b.pointer(pointer_size, "TypeID")?;
        tick.type_name = Some(b.utf16z("TypeName")?);
    }
    Ok(tick)
}

/// Decodes a thread sample's payload: 1 = the thread was in native (external) code, 2 = managed.
pub fn parse_thread_sample(payload: &[u8], offset: u64) -> Result<u32, NetTraceError> {
    Bytes::new(payload, offset).u32("thread sample type")
}

/// Decodes the command line from EventPipe's `ProcessInfo` event.
pub fn parse_process_info(payload: &[u8], offset: u64) -> Result<String, NetTraceError> {
    Bytes::new(payload, offset).utf16z("CommandLine")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_like_dotnet_trace() {
        let m = MethodInfo {
            method_id: 1,
            module_id: 2,
            start: 0,
            size: 1,
            namespace: "Rec".into(),
            name: "Down".into(),
            signature: "int32  (int32,class System.String)".into(),
            flags: 0x8,
        };
        assert_eq!(m.display_name(), "Rec.Down(int32,class System.String)");
        assert_eq!(m.user_name(), m.display_name());
        assert_eq!(m.tier(), None);
        let machine = MethodInfo {
            namespace: "Rootline.Tests.Async+<Level>c__async0".into(),
            name: "MoveNext".into(),
            signature: "void  ()".into(),
            flags: 4 << 7 | 0x8,
            ..m.clone()
        };
        assert_eq!(
            machine.display_name(),
            "Rootline.Tests.Async+<Level>c__async0.MoveNext()"
        );
        assert_eq!(machine.user_name(), "Rootline.Tests.Async.Level");
        assert_eq!(machine.tier(), Some("OptimizedTier1"));
        let module = ModuleInfo {
            module_id: 2,
            assembly_id: 3,
            il_path: "C:\\x\\System.Private.CoreLib.dll".into(),
            native_path: String::new(),
        };
        assert_eq!(module.short_name(), "System.Private.CoreLib");
        let module = ModuleInfo {
            il_path: "/tmp/rec/Rec.exe".into(),
            ..module
        };
        assert_eq!(module.short_name(), "Rec");
    }
}
