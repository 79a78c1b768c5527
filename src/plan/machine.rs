//! What `deltafin doctor` reads of this machine: the CPU and the SIMD level the kernels use,
//! the memory limit and where it comes from, a drive's device, file system, kind and free
//! space, the open-file limit, and GPUs present. Linux files only (`/proc`, `/sys`); a fact
//! that cannot be read is `None`.

use std::path::Path;

use serde::Serialize;

use crate::quant::SimdLevel;
use crate::store::plan::MemoryLimit;

/// The CPU.
#[derive(Clone, Debug, Serialize)]
pub struct Cpu {
    /// `model name` of `/proc/cpuinfo`.
    pub model: Option<String>,
    /// Cores this process may run on.
    pub cores: usize,
    /// The SIMD level the kernels use (`scalar`, `neon`, `avx2`, `avx512`) and every level
    /// the CPU runs.
    pub simd: &'static str,
    pub simd_available: Vec<&'static str>,
    /// Threads of the kernels' pool.
    pub threads: usize,
}

/// Reads [`Cpu`].
pub fn cpu() -> Cpu {
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    Cpu {
        model,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        simd: SimdLevel::detect().name(),
        simd_available: SimdLevel::available().iter().map(|l| l.name()).collect(),
        threads: rayon::current_num_threads(),
    }
}

/// Memory: `MemAvailable`, the cgroup's limit, and the smaller of the two.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pub available: Option<u64>,
    pub cgroup: Option<u64>,
    pub limit: Option<MemoryLimit>,
}

/// Reads [`Memory`].
pub fn memory() -> Memory {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let meminfo = read("/proc/meminfo");
    let cg = read("/proc/self/cgroup");
    Memory {
        available: MemoryLimit::from_texts(meminfo.as_deref(), None, read).map(|l| l.bytes),
        cgroup: MemoryLimit::from_texts(None, cg.as_deref(), read).map(|l| l.bytes),
        limit: MemoryLimit::of_this_process(),
    }
}

/// The device under a folder.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Device {
    /// The mounted source, e.g. `/dev/nvme0n1p2` or `/dev/loop3`.
    pub device: Option<String>,
    /// The mount point and file system type, e.g. `ext4`.
    pub mount_point: Option<String>,
    pub file_system: Option<String>,
    /// Whether the block device says it is rotational (`/sys/dev/block/M:m/queue/rotational`).
    pub rotational: Option<bool>,
    /// Whether it is an NVMe drive (its device name).
    pub nvme: bool,
    /// Bytes free to this user.
    pub free_bytes: Option<u64>,
}

/// The mountinfo line of the file system holding `dev` (`major:minor`): (mount point, type,
/// source).
fn mount_of(mountinfo: &str, dev: &str) -> Option<(String, String, String)> {
    mountinfo.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        (f.get(2) == Some(&dev)).then(|| {
            (
                f[4].to_string(),
                r[0].to_string(),
                r.get(1).unwrap_or(&"").to_string(),
            )
        })
    })
}

/// Reads [`Device`] for the folder `dir`.
pub fn device(dir: &Path) -> Device {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return Device::default();
    };
    let dev = meta.dev();
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let id = format!("{maj}:{min}");
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|t| mount_of(&t, &id));
    let sys = format!("/sys/dev/block/{id}");
    let rotational = [
        format!("{sys}/queue/rotational"),
        format!("{sys}/../queue/rotational"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .map(|t| t.trim() == "1");
    let device = mount.as_ref().map(|m| m.2.clone());
    Device {
        nvme: device.as_deref().is_some_and(|d| d.contains("nvme")),
        device,
        mount_point: mount.as_ref().map(|m| m.0.clone()),
        file_system: mount.map(|m| m.1),
        rotational,
        free_bytes: free_bytes(dir),
    }
}

/// Bytes free to this user on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The open-file limit: (soft, hard).
pub fn open_files() -> Option<(u64, u64)> {
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a writable rlimit.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0)
        .then_some((r.rlim_cur, r.rlim_max))
}

/// GPUs the kernel drivers show: NVIDIA (`/proc/driver/nvidia/gpus`) and AMD (`/dev/kfd`
/// with render nodes), by name.
pub fn gpus() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc/driver/nvidia/gpus") {
        for e in rd.flatten() {
            let info = std::fs::read_to_string(e.path().join("information")).unwrap_or_default();
            let model = info
                .lines()
                .find_map(|l| l.strip_prefix("Model:"))
                .map_or("NVIDIA GPU".to_string(), |m| m.trim().to_string());
            out.push(model);
        }
    }
    if Path::new("/dev/kfd").exists() {
        out.push("AMD GPU (/dev/kfd)".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_of_a_device_is_found_in_mountinfo() {
        let mi = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                  27 1 253:0 / / rw,relatime - ext4 /dev/vda rw\n\
                  90 27 7:1 / /var/tmp/drivelab/d1 rw - ext4 /dev/loop1 rw\n";
        assert_eq!(
            mount_of(mi, "7:1"),
            Some((
                "/var/tmp/drivelab/d1".into(),
                "ext4".into(),
                "/dev/loop1".into()
            ))
        );
        assert_eq!(mount_of(mi, "253:0").unwrap().1, "ext4");
        assert_eq!(mount_of(mi, "8:0"), None);
    }
}
