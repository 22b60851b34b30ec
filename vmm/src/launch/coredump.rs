//! `vm.coredump`: the paused VM as an ELF core gdb reads (layout in [`crate::coredump`]):
//! each vCPU's registers, read on its own thread, and every region of guest RAM, written
//! sparse (pages of zeros are left as holes, so a mostly empty guest makes a small file).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::operations::OperationError;
use super::{LaunchError, LaunchedVm};
use crate::coredump::{layout, CoreRegion, CoreVcpu};

/// How long the parked vCPUs may take to read their registers.
const REGISTERS_TIME: Duration = Duration::from_secs(2);
/// Guest memory is copied out this much at a time.
const CHUNK: usize = 1 << 20;
const PAGE: usize = 4096;

type Registers = BTreeMap<usize, Result<CoreVcpu, kvm_ioctls::Error>>;

impl LaunchedVm {
    /// Writes the paused VM's ELF core to `path` (created or replaced); returns its size.
    pub fn coredump(&self, path: &Path) -> Result<u64, LaunchError> {
        if !self.running()?.is_paused() {
            return Err(OperationError::NotPaused.into());
        }
        let vcpus = self.core_registers()?;
        let mem = self.vm.memory();
        let regions: Vec<CoreRegion> = mem
            .iter()
            .map(|r| CoreRegion {
                gpa: r.start_addr().0,
                len: r.len(),
            })
            .collect();
        let plan = layout(&vcpus, &regions);
        let write_err = |error| OperationError::CoreWrite {
            path: path.to_path_buf(),
            error,
        };
        let file = File::create(path).map_err(write_err)?;
        file.set_len(plan.file_size).map_err(write_err)?;
        file.write_all_at(&plan.head, 0).map_err(write_err)?;
        let mut buf = vec![0u8; CHUNK];
        for (region, at) in mem.iter().zip(&plan.region_offsets) {
            let len = region.len() as usize;
            for start in (0..len).step_by(CHUNK) {
                let chunk = &mut buf[..CHUNK.min(len - start)];
                region
                    .read_slice(chunk, MemoryRegionAddress(start as u64))
                    .map_err(|e| write_err(std::io::Error::other(e.to_string())))?;
                write_sparse(&file, at + start as u64, chunk).map_err(write_err)?;
            }
        }
        file.sync_all().map_err(write_err)?;
        Ok(plan.file_size)
    }

    /// Each vCPU's registers, read on its own thread while parked, in id order.
    fn core_registers(&self) -> Result<Vec<CoreVcpu>, LaunchError> {
        let read: Arc<Mutex<Registers>> = Arc::default();
        let into = read.clone();
        let task: crate::vcpu::VcpuTask = Arc::new(move |id, fd| {
            let got = fd.get_regs().and_then(|r| {
                let s = fd.get_sregs()?;
                Ok(CoreVcpu::from_kvm(id as u32, &r, &s))
            });
            into.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, got);
        });
        self.running()?.on_each_vcpu(task, REGISTERS_TIME)?;
        let read = std::mem::take(&mut *read.lock().unwrap_or_else(|p| p.into_inner()));
        read.into_iter()
            .map(|(id, r)| r.map_err(|error| OperationError::CoreRegisters { id, error }.into()))
            .collect()
    }
}

/// Writes `data` at `offset`, leaving its pages of zeros as holes (the file was sized first).
fn write_sparse(file: &File, offset: u64, data: &[u8]) -> std::io::Result<()> {
    let mut run: Option<usize> = None;
    for (i, page) in data.chunks(PAGE).enumerate() {
        let zero = page.iter().all(|&b| b == 0);
        match (zero, run) {
            (false, None) => run = Some(i * PAGE),
            (true, Some(from)) => {
                file.write_all_at(&data[from..i * PAGE], offset + from as u64)?;
                run = None;
            }
            _ => {}
        }
    }
    if let Some(from) = run {
        file.write_all_at(&data[from..], offset + from as u64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_writes_put_every_nonzero_page_in_place() {
        let path = std::env::temp_dir().join(format!("exitless-sparse-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        file.set_len(16 * PAGE as u64).unwrap();
        let mut data = vec![0u8; 6 * PAGE];
        data[PAGE + 5] = 1;
        data[2 * PAGE] = 2;
        data[6 * PAGE - 1] = 3;
        write_sparse(&file, 4 * PAGE as u64, &data).unwrap();
        let back = std::fs::read(&path).unwrap();
        assert_eq!(&back[4 * PAGE..10 * PAGE], &data[..]);
        assert!(back[..4 * PAGE]
            .iter()
            .chain(&back[10 * PAGE..])
            .all(|&b| b == 0));
        std::fs::remove_file(&path).unwrap();
    }
}
