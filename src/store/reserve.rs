//! Disk space kept in reserve beside the db (`<db>-reserve`, [`RESERVE`] bytes of zeros), so a
//! WAL that filled its file system can still be copied back (issue 24's disk-full drill).
//!
//! A long-lived reader (a `sqlite3` shell left in a transaction) keeps the WAL from being reset, so
//! under load it can grow until the disk is full. Copying it back into the db then needs the db to
//! grow, for which there is no room: without the reserve crossbar never recovered on its own, and
//! would not even start again on that disk. The checkpoint thread gives the reserve up when the disk
//! is full and takes it again once the WAL has been reset and writes go through (`checkpoint`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bytes held in reserve: a checkpoint grows the db by the pages the WAL adds, a few percent of
/// the WAL (about 70 KiB for an 8 MiB WAL of accounting rows), so this frees a WAL of hundreds of
/// MiB.
pub(super) const RESERVE: u64 = 8 << 20;

/// The reserve file of one db.
#[derive(Debug)]
pub(super) struct Reserve {
    path: PathBuf,
    size: u64,
}

impl Reserve {
    pub(super) fn of(db: &Path, size: u64) -> Reserve {
        let mut path = db.as_os_str().to_owned();
        path.push("-reserve");
        Reserve {
            path: PathBuf::from(path),
            size,
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the reserve is on disk, whole.
    pub(super) fn held(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.len() == self.size)
    }

    /// Writes the reserve (real blocks, not a sparse file). On failure (no room) nothing is left
    /// behind and the error says why.
    pub(super) fn take(&self) -> std::io::Result<()> {
        let written = write_zeros(&self.path, self.size);
        if written.is_err() {
            let _ = std::fs::remove_file(&self.path);
        }
        written
    }

    /// Gives the space back. True when there was a reserve to give.
    pub(super) fn release(&self) -> bool {
        std::fs::remove_file(&self.path).is_ok()
    }
}

fn write_zeros(path: &Path, size: u64) -> std::io::Result<()> {
    const PIECE: usize = 64 << 10;
    let zeros = [0u8; PIECE];
    let mut file: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(PIECE as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_taken_whole_and_given_back() {
        let dir = std::env::temp_dir().join(format!("crossbar-reserve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let reserve = Reserve::of(&dir.join("crossbar.db"), 200_000);
        assert_eq!(reserve.path(), dir.join("crossbar.db-reserve"));
        assert!(!reserve.held());
        reserve.take().unwrap();
        assert!(reserve.held());
        assert_eq!(std::fs::metadata(reserve.path()).unwrap().len(), 200_000);
        assert!(reserve.release());
        assert!(!reserve.held() && !reserve.release());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
