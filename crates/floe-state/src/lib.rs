//! `floe-state`: keyed operator state in RocksDB — the working copy of every stateful
//! operator's state in one process, kept per **source partition**, with the changes of each
//! checkpoint ready to be committed with the data.
//!
//! * **Layout.** One RocksDB per job process (wiped when it opens: the durable copy is the
//!   job's state table in Iceberg, see `floe-runtime`), in a directory the process claims by
//!   a file lock, so replicas on one host that share a state directory each get their own. A key is
//!   `[partition: u32][operator: u16][operator's key]`, big-endian, so one partition's state
//!   is one key range: dropped or restored as a unit when Kafka moves the partition.
//! * **Changes per epoch.** Every write is held in memory under the current *epoch*, the
//!   last write of a key replacing the one before, and reaches RocksDB in one sorted batch
//!   when the epoch is sealed or before a scan (a get sees it at once): a key written many
//!   times between scans costs RocksDB one write, and sorted inserts are the memtable's cheap
//!   case. [`StateStore::seal`] closes the epoch at a checkpoint barrier and
//!   [`StateStore::changes`] hands over exactly what changed in it, each key once and in no
//!   particular order (the state table is a set of keys: sorting bought nothing) — the cost of a
//!   checkpoint grows with the keys changed, not the state held. An epoch's changes are what
//!   the checkpoint writes to the state table anyway, so holding them costs no more than the
//!   checkpoint itself. [`StateStore::release`] forgets epochs once they are committed.
//! * **Bigger than memory.** RocksDB keeps what does not fit on local disk; the memory budget
//!   is split between its block cache and its memtables. The write-ahead log is off: a crash
//!   loses the local copy, never the committed state.
//!
//! The operator's key bytes are the operator's own; this crate only orders them.

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options,
    ReadOptions, WriteBatch, WriteBufferManager, WriteOptions,
};
use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

const STATE: &str = "state";

/// Writes not in RocksDB yet: per state key (`[partition][operator][key]`), its last value
/// (`None`: deleted).
type Pending = HashMap<Vec<u8>, Option<Vec<u8>>, foldhash::fast::RandomState>;

/// The changes of a sealed epoch: each key once, with its last value, in no particular order.
type Epoch = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// A state failure (the local RocksDB).
#[derive(Debug, thiserror::Error)]
#[error("operator state: {0}")]
pub struct StateError(String);

impl From<rocksdb::Error> for StateError {
    fn from(e: rocksdb::Error) -> Self {
        Self(e.to_string())
    }
}

/// The result type of this crate.
pub type StateResult<T> = Result<T, StateError>;

/// One key changed in an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The operator (its index in the job).
    pub operator: u16,
    /// The source partition (the job's index).
    pub partition: u32,
    /// The operator's key.
    pub key: Vec<u8>,
    /// The new value; `None` when deleted.
    pub value: Option<Vec<u8>>,
}

/// The state of every stateful operator of a job process.
pub struct StateStore {
    db: DB,
    dir: PathBuf,
    epoch: u64,
    /// The writes of the current epoch not in RocksDB yet (its capacity is kept from epoch
    /// to epoch).
    pending: Pending,
    /// The writes of the current epoch in RocksDB already, each key's last (its capacity is
    /// kept from epoch to epoch too).
    current: Pending,
    /// The changes of sealed epochs not handed over or released yet.
    sealed: BTreeMap<u64, Epoch>,
    write: WriteOptions,
    /// Held for the store's life: the claim on `dir` (see [`StateStore::open`]).
    _lock: std::fs::File,
}

/// How many stores may share one base directory (replicas of a job on one host).
const MAX_SLOTS: usize = 64;

/// The first slot of `base` whose lock this process can take, and the locked file.
fn claim(base: &Path) -> StateResult<(PathBuf, std::fs::File)> {
    if let Some(parent) = base.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| StateError(format!("cannot create {}: {e}", parent.display())))?;
    }
    for slot in 1..=MAX_SLOTS {
        let dir = if slot == 1 {
            base.to_path_buf()
        } else {
            let mut name = base.as_os_str().to_owned();
            name.push(format!(".{slot}"));
            PathBuf::from(name)
        };
        let mut lock_path = dir.as_os_str().to_owned();
        lock_path.push(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StateError(format!("cannot open {}: {e}", lock_path.to_string_lossy())))?;
        match file.try_lock() {
            Ok(()) => return Ok((dir, file)),
            Err(std::fs::TryLockError::WouldBlock) => continue,
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StateError(format!(
                    "cannot lock {}: {e}",
                    lock_path.to_string_lossy()
                )));
            }
        }
    }
    Err(StateError(format!(
        "{MAX_SLOTS} stores already hold {} and its siblings",
        base.display()
    )))
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("dir", &self.dir)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

fn prefix(partition: u32, operator: u16) -> [u8; 6] {
    let mut p = [0u8; 6];
    p[..4].copy_from_slice(&partition.to_be_bytes());
    p[4..].copy_from_slice(&operator.to_be_bytes());
    p
}

fn state_key(partition: u32, operator: u16, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(6 + key.len());
    k.extend_from_slice(&prefix(partition, operator));
    k.extend_from_slice(key);
    k
}

/// The smallest key after every key starting with `prefix` (`None`: no such key).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl StateStore {
    /// Opens an empty store with about `memory` bytes for caches and write buffers, in the
    /// first of `dir`, `dir.2`, `dir.3`, … that no other store holds (anything there is
    /// removed first). The claim is an exclusive lock on a file beside it, held while the
    /// store lives and released by the OS when the process dies, so replicas on one host
    /// sharing a state directory never clear or share each other's RocksDB.
    pub fn open(dir: &Path, memory: usize) -> StateResult<Self> {
        let (dir, lock) = claim(dir)?;
        let dir = dir.as_path();
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .map_err(|e| StateError(format!("cannot clear {}: {e}", dir.display())))?;
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| StateError(format!("cannot create {}: {e}", dir.display())))?;
        let memory = memory.max(8 << 20);
        let cache = Cache::new_lru_cache(memory / 2);
        let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            memory / 2,
            true,
            cache.clone(),
        );
        // `lookups`: the column family is read key by key (not only scanned), so its memtables
        // get a bloom filter too — most gets of a new key would otherwise walk every memtable.
        let cf_options = |lookups: bool| {
            let mut o = Options::default();
            if lookups {
                o.set_memtable_prefix_bloom_ratio(0.05);
                o.set_memtable_whole_key_filtering(true);
            }
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&cache);
            // Index and filter blocks live in the (bounded) cache, partitioned so a lookup
            // loads only the small partition it needs, with the top level and L0's pinned:
            // otherwise a state larger than the cache re-reads (and checksums and
            // decompresses) whole filter blocks on every get.
            table.set_cache_index_and_filter_blocks(true);
            table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
            table.set_partition_filters(true);
            table.set_pin_top_level_index_and_filter(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            table.set_bloom_filter(10.0, false);
            o.set_block_based_table_factory(&table);
            o.set_compression_type(rocksdb::DBCompressionType::Lz4);
            o.set_write_buffer_size((memory / 8).clamp(1 << 20, 64 << 20));
            o.set_max_write_buffer_number(3);
            o
        };
        let mut options = cf_options(false);
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_write_buffer_manager(&buffers);
        options.set_max_background_jobs(2);
        options.set_keep_log_file_num(2);
        let db = DB::open_cf_descriptors(
            &options,
            dir,
            [ColumnFamilyDescriptor::new(STATE, cf_options(true))],
        )?;
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        Ok(Self {
            db,
            dir: dir.to_path_buf(),
            epoch: 1,
            pending: Pending::default(),
            current: Pending::default(),
            sealed: BTreeMap::new(),
            write,
            _lock: lock,
        })
    }

    /// The directory this store claimed.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn cf(&self, name: &str) -> StateResult<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| StateError(format!("no column family {name}")))
    }

    /// The epoch writes go to now.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A key's value.
    pub fn get(&self, operator: u16, partition: u32, key: &[u8]) -> StateResult<Option<Vec<u8>>> {
        let k = state_key(partition, operator, key);
        if let Some(value) = self.pending.get(&k) {
            return Ok(value.clone());
        }
        Ok(self.db.get_cf(&self.cf(STATE)?, k)?)
    }

    /// The values of `keys` (of one operator and partition), in their order: [`Self::get`] of
    /// each, with the RocksDB lookups of those not pending made in one sorted batch, which
    /// walks each file's index and filter once for all of them instead of once per key.
    pub fn get_many(
        &self,
        operator: u16,
        partition: u32,
        keys: &[&[u8]],
    ) -> StateResult<Vec<Option<Vec<u8>>>> {
        let mut values = vec![None; keys.len()];
        let mut stored = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let k = state_key(partition, operator, key);
            match self.pending.get(&k) {
                Some(value) => values[i].clone_from(value),
                None => stored.push((k, i)),
            }
        }
        stored.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let found =
            self.db
                .batched_multi_get_cf(&self.cf(STATE)?, stored.iter().map(|(k, _)| k), true);
        for ((_, i), value) in stored.iter().zip(found) {
            values[*i] = value?.map(|v| v.to_vec());
        }
        Ok(values)
    }

    /// Sets a key (recorded as a change of the current epoch).
    pub fn put(
        &mut self,
        operator: u16,
        partition: u32,
        key: &[u8],
        value: &[u8],
    ) -> StateResult<()> {
        self.pending
            .insert(state_key(partition, operator, key), Some(value.to_vec()));
        Ok(())
    }

    /// Removes a key (recorded as a change of the current epoch).
    pub fn delete(&mut self, operator: u16, partition: u32, key: &[u8]) -> StateResult<()> {
        self.pending
            .insert(state_key(partition, operator, key), None);
        Ok(())
    }

    /// Writes the pending writes to RocksDB in one batch, in key order, and keeps them as
    /// changes of the current epoch (a key written in an earlier run of the epoch keeps only
    /// its last value, so an epoch never holds a key twice and needs no sort when it is
    /// handed over).
    fn flush(&mut self) -> StateResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut run: Vec<(&Vec<u8>, &Option<Vec<u8>>)> = self.pending.iter().collect();
        run.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let cf = self.cf(STATE)?;
        let mut batch = WriteBatch::default();
        for (key, value) in run {
            match value {
                Some(value) => batch.put_cf(cf, key, value),
                None => batch.delete_cf(cf, key),
            }
        }
        self.db.write_opt(batch, &self.write)?;
        self.current.extend(self.pending.drain());
        Ok(())
    }

    /// Sets a key without recording a change (restoring committed state).
    pub fn load(
        &mut self,
        operator: u16,
        partition: u32,
        key: &[u8],
        value: &[u8],
    ) -> StateResult<()> {
        self.flush()?;
        Ok(self.db.put_cf_opt(
            self.cf(STATE)?,
            state_key(partition, operator, key),
            value,
            &self.write,
        )?)
    }

    /// Calls `each(key, value)` for the operator's keys of a partition in `[from, to)`
    /// (`to = None`: to the end), in key order, until it breaks. Pending writes reach RocksDB
    /// first.
    pub fn scan(
        &mut self,
        operator: u16,
        partition: u32,
        from: &[u8],
        to: Option<&[u8]>,
        mut each: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> StateResult<()> {
        self.flush()?;
        let start = state_key(partition, operator, from);
        let end = match to {
            Some(to) => Some(state_key(partition, operator, to)),
            None => prefix_end(&prefix(partition, operator)),
        };
        let mut read = ReadOptions::default();
        if let Some(end) = end {
            read.set_iterate_upper_bound(end);
        }
        let iter = self.db.iterator_cf_opt(
            self.cf(STATE)?,
            read,
            IteratorMode::From(&start, Direction::Forward),
        );
        for item in iter {
            let (key, value) = item?;
            if each(&key[6..], &value).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Closes the current epoch (a checkpoint barrier) and returns it; later writes belong
    /// to the next one.
    pub fn seal(&mut self) -> StateResult<u64> {
        self.flush()?;
        let changes: Epoch = self.current.drain().collect();
        if !changes.is_empty() {
            self.sealed.insert(self.epoch, changes);
        }
        self.epoch += 1;
        Ok(self.epoch - 1)
    }

    /// Hands over every key changed in `epoch` (its last value), in no particular order; the
    /// epoch keeps nothing after (a second call sees no change).
    pub fn changes(&mut self, epoch: u64) -> Vec<Change> {
        let Some(changes) = self.sealed.remove(&epoch) else {
            return Vec::new();
        };
        changes
            .into_iter()
            .map(|(mut key, value)| {
                let partition = u32::from_be_bytes(key[..4].try_into().expect("4 bytes"));
                let operator = u16::from_be_bytes(key[4..6].try_into().expect("2 bytes"));
                key.drain(..6);
                Change {
                    operator,
                    partition,
                    key,
                    value,
                }
            })
            .collect()
    }

    /// Forgets the changes of every epoch up to `epoch` (they are committed).
    pub fn release(&mut self, epoch: u64) -> StateResult<()> {
        self.sealed.retain(|e, _| *e > epoch);
        Ok(())
    }

    /// Forgets a partition's state of every operator (and its unreleased changes stay, to be
    /// dropped with their epochs).
    pub fn drop_partition(&mut self, partition: u32) -> StateResult<()> {
        self.flush()?;
        let cf = self.cf(STATE)?;
        let from = partition.to_be_bytes().to_vec();
        match prefix_end(&from) {
            Some(to) => self.db.delete_range_cf(cf, from, to)?,
            None => self.db.delete_range_cf(cf, from, vec![0xff; 8])?,
        }
        Ok(())
    }

    /// Forgets everything: state and changes of every epoch.
    pub fn clear(&mut self) -> StateResult<()> {
        let cf = self.cf(STATE)?;
        self.db
            .delete_range_cf(cf, Vec::<u8>::new(), vec![0xff; 16])?;
        self.pending.clear();
        self.current.clear();
        self.sealed.clear();
        Ok(())
    }

    /// RocksDB's estimates: keys held, and bytes of live data (on disk and in memtables).
    pub fn size(&self) -> (u64, u64) {
        let Ok(cf) = self.cf(STATE) else {
            return (0, 0);
        };
        let number = |name: &str| {
            self.db
                .property_int_value_cf(cf, name)
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        (
            number("rocksdb.estimate-num-keys"),
            number("rocksdb.estimate-live-data-size") + number("rocksdb.cur-size-all-mem-tables"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(tag: &str) -> StateStore {
        let dir = std::env::temp_dir().join(format!("floe-state-{tag}-{}", std::process::id()));
        StateStore::open(&dir, 16 << 20).unwrap()
    }

    fn keys(s: &mut StateStore, op: u16, p: u32, from: &[u8], to: Option<&[u8]>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        s.scan(op, p, from, to, |k, _| {
            out.push(k.to_vec());
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    #[test]
    fn stores_sharing_a_directory_never_clear_each_other() {
        let base = std::env::temp_dir().join(format!("floe-state-slots-{}", std::process::id()));
        let mut first = StateStore::open(&base, 8 << 20).unwrap();
        first.put(0, 0, b"k", b"first").unwrap();
        // A second store (another replica on this host) takes the next slot and leaves the
        // first one's data alone.
        let second = StateStore::open(&base, 8 << 20).unwrap();
        assert_ne!(second.dir(), first.dir());
        assert_eq!(
            first.get(0, 0, b"k").unwrap().as_deref(),
            Some(&b"first"[..])
        );
        assert_eq!(second.get(0, 0, b"k").unwrap(), None);
        // A slot is free again once its store is gone (a stopped or killed process).
        let first_dir = first.dir().to_path_buf();
        drop(first);
        let third = StateStore::open(&base, 8 << 20).unwrap();
        assert_eq!(third.dir(), first_dir);
        assert_eq!(
            third.get(0, 0, b"k").unwrap(),
            None,
            "a claimed slot starts empty"
        );
    }

    #[test]
    fn partitions_and_operators_keep_apart_and_scan_in_order() {
        let mut s = store("scan");
        s.put(1, 7, b"b", b"2").unwrap();
        s.put(1, 7, b"a", b"1").unwrap();
        s.put(1, 7, b"c", b"3").unwrap();
        s.put(2, 7, b"a", b"other operator").unwrap();
        s.put(1, 8, b"a", b"other partition").unwrap();
        assert_eq!(s.get(1, 7, b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(keys(&mut s, 1, 7, b"", None), [b"a", b"b", b"c"]);
        assert_eq!(keys(&mut s, 1, 7, b"b", Some(b"c")), [b"b"]);
        s.drop_partition(7).unwrap();
        assert!(keys(&mut s, 1, 7, b"", None).is_empty());
        assert_eq!(
            s.get(1, 8, b"a").unwrap().as_deref(),
            Some(&b"other partition"[..])
        );
    }

    #[test]
    fn each_epoch_holds_the_last_change_of_each_key() {
        let mut s = store("epochs");
        s.load(1, 0, b"old", b"restored").unwrap();
        s.put(1, 0, b"k", b"v1").unwrap();
        s.put(1, 0, b"k", b"v2").unwrap();
        s.put(1, 0, b"gone", b"x").unwrap();
        s.delete(1, 0, b"gone").unwrap();
        let first = s.seal().unwrap();
        s.put(1, 0, b"k", b"v3").unwrap();
        let mut changes = s.changes(first);
        changes.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(
            changes,
            vec![
                Change {
                    operator: 1,
                    partition: 0,
                    key: b"gone".to_vec(),
                    value: None
                },
                Change {
                    operator: 1,
                    partition: 0,
                    key: b"k".to_vec(),
                    value: Some(b"v2".to_vec())
                },
            ]
        );
        s.release(first).unwrap();
        assert!(s.changes(first).is_empty());
        let second = s.seal().unwrap();
        let next: Vec<_> = s.changes(second).into_iter().map(|c| c.value).collect();
        assert_eq!(next, vec![Some(b"v3".to_vec())]);
        assert!(
            s.changes(second).is_empty(),
            "an epoch's changes are handed over once"
        );
        s.clear().unwrap();
        assert_eq!(s.get(1, 0, b"k").unwrap(), None);
        assert_eq!(s.get(1, 0, b"old").unwrap(), None);
    }

    #[test]
    fn a_write_is_seen_at_once_and_an_epoch_written_in_runs_hands_over_each_key_once() {
        let mut s = store("runs");
        s.put(1, 0, b"a", b"1").unwrap();
        s.put(1, 0, b"b", b"1").unwrap();
        // A get sees a write still pending; a scan writes the pending ones to RocksDB first.
        assert_eq!(s.get(1, 0, b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(keys(&mut s, 1, 0, b"", None), [b"a", b"b"]);
        // The same keys again, in a second run of the epoch: a deletion hides what RocksDB
        // holds before it gets there.
        s.put(1, 0, b"a", b"2").unwrap();
        s.delete(1, 0, b"b").unwrap();
        assert_eq!(s.get(1, 0, b"b").unwrap(), None);
        s.put(1, 0, b"c", b"1").unwrap();
        let epoch = s.seal().unwrap();
        assert_eq!(keys(&mut s, 1, 0, b"", None), [b"a", b"c"]);
        let mut changes: Vec<_> = s
            .changes(epoch)
            .into_iter()
            .map(|c| (c.key, c.value))
            .collect();
        changes.sort();
        assert_eq!(
            changes,
            vec![
                (b"a".to_vec(), Some(b"2".to_vec())),
                (b"b".to_vec(), None),
                (b"c".to_vec(), Some(b"1".to_vec())),
            ]
        );
        // Many keys at once: pending, in RocksDB, absent, and a key asked twice.
        s.put(1, 0, b"c", b"2").unwrap();
        assert_eq!(
            s.get_many(1, 0, &[b"c", b"a", b"b", b"zz", b"a"]).unwrap(),
            [
                Some(b"2".to_vec()),
                Some(b"2".to_vec()),
                None,
                None,
                Some(b"2".to_vec())
            ]
        );
        // A partition dropped with writes pending keeps none of them.
        s.put(1, 3, b"x", b"1").unwrap();
        s.drop_partition(3).unwrap();
        assert_eq!(s.get(1, 3, b"x").unwrap(), None);
    }
}

#[cfg(test)]
mod bigger_than_memory {
    use super::*;

    #[test]
    fn a_checkpoint_holds_the_keys_changed_not_the_state_held() {
        let dir = std::env::temp_dir().join(format!("floe-state-big-{}", std::process::id()));
        let budget = 8 << 20;
        let mut s = StateStore::open(&dir, budget).unwrap();
        let value = vec![7u8; 200];
        for i in 0..300_000u32 {
            s.put(1, i % 4, &i.to_be_bytes(), &value).unwrap();
        }
        let first = s.seal().unwrap();
        assert_eq!(s.changes(first).len(), 300_000);
        s.release(first).unwrap();
        for i in (0..300_000u32).step_by(300) {
            s.put(1, i % 4, &i.to_be_bytes(), &[1]).unwrap();
        }
        let second = s.seal().unwrap();
        assert_eq!(
            s.changes(second).len(),
            1_000,
            "only the keys changed since the last barrier"
        );
        assert_eq!(s.get(1, 0, &0u32.to_be_bytes()).unwrap(), Some(vec![1]));
        assert_eq!(s.get(1, 1, &1u32.to_be_bytes()).unwrap(), Some(value));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
