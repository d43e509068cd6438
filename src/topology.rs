//! The machine as the engine sees it: NUMA nodes and the CPUs this process
//! may run on, the distances between nodes, plus worker placement and core
//! pinning.
//!
//! Nodes and CPUs come from hwloc; when hwloc cannot build a topology the
//! engine still runs, as one node holding every allowed CPU (node ids then
//! unknown). Distances come from sysfs (`/sys/devices/system/node`), read
//! by our own checked parser: hwloc reads the same files on Linux, and its
//! Rust wrapper asserts on output it does not expect, where a malformed
//! table here must only mean "no distances". Placement, NUMA tiers and
//! everything downstream take a [`Topology`] value rather than probing the
//! machine, so tests can describe several NUMA nodes on a one-node machine.

use std::io::Read;
use std::path::Path;

use hwlocality::object::types::ObjectType;

use crate::error::{Error, Result};

/// The machine as the engine sees it: NUMA nodes with their CPUs, restricted
/// to the CPUs this process may run on, and the node distance table when
/// the kernel gives one. Injectable for tests through
/// [`Topology::from_nodes`] and [`Topology::from_nodes_with_distances`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<NumaNode>,
    /// Every online node's distance to every other (not only nodes with
    /// allowed CPUs: a NIC may hang off a node we may not run on).
    distances: Option<NumaDistances>,
    /// False for the fallback topology: its node 0 is a guess, so no worker
    /// is said to sit on any node.
    nodes_known: bool,
}

/// NUMA distances between nodes, in the kernel's units (ACPI SLIT: 10 to
/// itself, larger for farther nodes). Built by [`NumaDistances::new`] or
/// read from sysfs by [`NumaDistances::read_sysfs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaDistances {
    /// Node OS indices, distinct.
    nodes: Vec<u32>,
    /// Row-major `nodes.len()²` table: `matrix[i * n + j]` is the distance
    /// from `nodes[i]` to `nodes[j]`.
    matrix: Vec<u32>,
}

/// One NUMA node and the allowed CPUs attached to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    /// The OS index of the node (as in `/sys/devices/system/node/nodeN`).
    pub os_index: u32,
    /// OS CPU indices, sorted.
    pub cpus: Vec<usize>,
}

/// Why workers could not be placed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TopologyError {
    /// An explicitly configured core is outside this process's CPU set.
    #[error("worker core {core} is not one this process may run on (allowed: {allowed:?})")]
    CoreNotAllowed {
        /// The configured core.
        core: usize,
        /// The CPUs this process may run on.
        allowed: Vec<usize>,
    },
    /// The topology holds no CPU at all, so there is nowhere to put a worker.
    #[error("the topology has no CPUs to place {count} worker(s) on")]
    NoCpus {
        /// Workers that were to be placed.
        count: usize,
    },
}

impl Topology {
    /// Probes the machine with hwloc, restricted to the CPUs the process's
    /// cpuset allows (hwloc's allowed cpuset). That is deliberately not the
    /// calling thread's affinity: an application that pins its own thread
    /// before building the engine must not confine every worker to that
    /// core. On any hwloc error, falls back to one node holding the calling
    /// thread's allowed CPUs and logs why at debug level. The distance
    /// table is read from `/sys` ([`NumaDistances::read_sysfs`]); without
    /// one (or with the fallback, whose node ids are a guess) every remote
    /// node is tier 1.
    pub(crate) fn detect() -> Topology {
        match from_hwloc(None) {
            Ok(topology) => {
                tracing::debug!(nodes = ?topology.nodes, "topology detected with hwloc");
                topology.with_sysfs_distances(Path::new("/sys"))
            }
            Err(why) => {
                let cpus = core_affinity::get_core_ids()
                    .map(|ids| ids.into_iter().map(|c| c.id).collect())
                    .unwrap_or_else(fallback_cpus);
                tracing::debug!(%why, ?cpus, "hwloc topology unavailable; using one NUMA node");
                Topology {
                    nodes_known: false,
                    ..Topology::from_nodes(vec![NumaNode { os_index: 0, cpus }])
                }
            }
        }
    }

    /// A synthetic topology, for tests and for callers that know better than
    /// hwloc. Node order is kept; each node's CPUs are sorted and
    /// de-duplicated. It has no distance table: every other node is tier 1.
    pub(crate) fn from_nodes(nodes: Vec<NumaNode>) -> Topology {
        let nodes = nodes
            .into_iter()
            .map(|mut node| {
                node.cpus.sort_unstable();
                node.cpus.dedup();
                node
            })
            .collect();
        Topology {
            nodes,
            distances: None,
            nodes_known: true,
        }
    }

    /// [`Topology::from_nodes`] with a distance table (which may name nodes
    /// the CPU list does not: memory-only nodes, nodes outside the cpuset).
    #[cfg(any(test, feature = "testing"))]
    pub fn from_nodes_with_distances(nodes: Vec<NumaNode>, distances: NumaDistances) -> Topology {
        Topology {
            distances: Some(distances),
            ..Topology::from_nodes(nodes)
        }
    }

    /// This topology with the distance table read under `sys_root`; a
    /// missing or malformed table leaves it without one (logged at debug).
    fn with_sysfs_distances(mut self, sys_root: &Path) -> Topology {
        match NumaDistances::read_sysfs(sys_root) {
            Ok(table) => self.distances = Some(table),
            Err(why) => {
                tracing::debug!(%why, "no NUMA distance table; every remote node is tier 1")
            }
        }
        self
    }

    /// The distance table, when there is one.
    #[cfg(test)]
    pub(crate) fn distances(&self) -> Option<&NumaDistances> {
        self.distances.as_ref()
    }

    /// The NUMA node a worker runs on, from the core it is pinned to
    /// (`Engine::worker_cores`): `None` when it is not pinned, the core is
    /// not in the topology, or the topology is the fallback guess.
    pub(crate) fn worker_node(&self, core: Option<usize>) -> Option<u32> {
        if !self.nodes_known {
            return None;
        }
        self.node_of_cpu(core?)
    }

    /// How far a device on node `device` is from a worker on node `from`,
    /// as a rank the rail selector turns into a penalty: 0 when either node
    /// is unknown or they are the same node; otherwise 1 for the nearest
    /// class of remote distance from `from`, 2 for the next, and so on
    /// (the rank of distance(from, device) among the distinct distances
    /// from `from` to every other node in the table, plus one; saturating
    /// at `u8::MAX`). Without a table, or with one that lacks either node,
    /// any other node is tier 1.
    ///
    /// ```
    /// use tent::topology::{NumaDistances, NumaNode, Topology};
    ///
    /// let nodes = (0..4).map(|i| NumaNode { os_index: i, cpus: vec![i as usize] }).collect();
    /// let d = NumaDistances::new(
    ///     vec![0, 1, 2, 3],
    ///     vec![
    ///         vec![10, 12, 20, 20],
    ///         vec![12, 10, 20, 20],
    ///         vec![20, 20, 10, 12],
    ///         vec![20, 20, 12, 10],
    ///     ],
    /// )
    /// .unwrap();
    /// let t = Topology::from_nodes_with_distances(nodes, d);
    /// assert_eq!(t.tier(Some(0), Some(0)), 0);
    /// assert_eq!(t.tier(Some(0), Some(1)), 1);
    /// assert_eq!(t.tier(Some(0), Some(3)), 2);
    /// assert_eq!(t.tier(None, Some(3)), 0);
    /// ```
    pub fn tier(&self, from: Option<u32>, device: Option<u32>) -> u8 {
        let (Some(from), Some(device)) = (from, device) else {
            return 0;
        };
        if from == device {
            return 0;
        }
        self.distances
            .as_ref()
            .and_then(|table| table.remote_rank(from, device))
            .unwrap_or(1)
    }

    /// The NUMA nodes, in OS-index order when detected.
    pub(crate) fn nodes(&self) -> &[NumaNode] {
        &self.nodes
    }

    /// The OS index of every node it knows of: those with allowed CPUs
    /// and those in the distance table (memory-only nodes included), not
    /// de-duplicated.
    pub(crate) fn node_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let table = self.distances.iter().flat_map(|d| d.nodes.iter().copied());
        self.nodes.iter().map(|n| n.os_index).chain(table)
    }

    /// Every allowed CPU, sorted.
    pub(crate) fn cpus(&self) -> Vec<usize> {
        let mut cpus: Vec<usize> = self
            .nodes
            .iter()
            .flat_map(|n| n.cpus.iter().copied())
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus
    }

    /// The OS index of the node holding `cpu`, if `cpu` is allowed.
    pub(crate) fn node_of_cpu(&self, cpu: usize) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.cpus.binary_search(&cpu).is_ok())
            .map(|n| n.os_index)
    }

    /// Chooses a core for each of `count` workers.
    ///
    /// With `explicit` cores, worker `i` gets `explicit[i % len]`; every
    /// listed core must be allowed, even one no worker ends up using, since a
    /// typo there is still a configuration error. Otherwise workers go
    /// round-robin across NUMA nodes, each node handing out its cores from
    /// the end of its list: the first cores (core 0 above all) are where the
    /// OS and application threads tend to run. With more workers than cores
    /// a node wraps around to its last core again.
    #[cfg(test)]
    pub(crate) fn place_workers(
        &self,
        count: usize,
        explicit: &[usize],
    ) -> Result<Vec<usize>, TopologyError> {
        self.place_workers_near(count, explicit, &[])
    }

    /// [`Topology::place_workers`], but with no explicit cores the workers
    /// go on the CPUs of `near` (NUMA node os indices: where the RDMA NICs
    /// are), spread over those nodes; nodes not in the topology, or a
    /// `near` that names none, leave the plain spread.
    pub(crate) fn place_workers_near(
        &self,
        count: usize,
        explicit: &[usize],
        near: &[u32],
    ) -> Result<Vec<usize>, TopologyError> {
        if !explicit.is_empty() {
            let allowed = self.cpus();
            if let Some(&core) = explicit.iter().find(|c| allowed.binary_search(c).is_err()) {
                return Err(TopologyError::CoreNotAllowed { core, allowed });
            }
            return Ok((0..count).map(|i| explicit[i % explicit.len()]).collect());
        }
        let mut nodes: Vec<&NumaNode> = self.nodes.iter().filter(|n| !n.cpus.is_empty()).collect();
        if nodes.iter().any(|n| near.contains(&n.os_index)) {
            nodes.retain(|n| near.contains(&n.os_index));
        }
        if nodes.is_empty() {
            return if count == 0 {
                Ok(Vec::new())
            } else {
                Err(TopologyError::NoCpus { count })
            };
        }
        let mut taken = vec![0usize; nodes.len()];
        let mut placement = Vec::with_capacity(count);
        for i in 0..count {
            let k = i % nodes.len();
            let cpus = &nodes[k].cpus;
            placement.push(cpus[cpus.len() - 1 - taken[k] % cpus.len()]);
            taken[k] += 1;
        }
        Ok(placement)
    }
}

impl NumaDistances {
    /// The most nodes a table may hold (Linux's `MAX_NUMNODES` ceiling); a
    /// sysfs node list beyond it is malformed, not a reason to allocate.
    pub(crate) const MAX_NODES: usize = 1024;

    /// A table over `nodes` (OS indices, distinct), where `rows[i][j]` is
    /// the distance from `nodes[i]` to `nodes[j]`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// when there are no nodes or more than [`Self::MAX_NODES`], a node is
    /// named twice, or the rows do not form a square matrix.
    pub fn new(nodes: Vec<u32>, rows: Vec<Vec<u32>>) -> Result<NumaDistances> {
        let n = nodes.len();
        if n == 0 || n > Self::MAX_NODES {
            return Err(Error::invalid(format!(
                "a NUMA distance table needs 1 to {} nodes, not {n}",
                Self::MAX_NODES
            )));
        }
        let mut sorted = nodes.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!(
                "NUMA node {} appears twice in the distance table",
                w[0]
            )));
        }
        if rows.len() != n {
            return Err(Error::invalid(format!(
                "NUMA distance table has {} rows for {n} nodes",
                rows.len()
            )));
        }
        let mut matrix = Vec::with_capacity(n * n);
        for (node, row) in nodes.iter().zip(&rows) {
            if row.len() != n {
                return Err(Error::invalid(format!(
                    "NUMA node {node}'s distance row has {} entries for {n} nodes",
                    row.len()
                )));
            }
            matrix.extend_from_slice(row);
        }
        Ok(NumaDistances { nodes, matrix })
    }

    /// Reads the kernel's table under `sys_root` (normally `/sys`): the
    /// online nodes from `devices/system/node/online` (a list such as
    /// `0-1,4`), then each one's `node<N>/distance` row, whose k-th value
    /// is the distance to the k-th online node.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// naming the file, for any file missing, over-long, not UTF-8, or not
    /// in the kernel's format (a value that is negative or beyond `u32`, a
    /// row of the wrong length, a node list out of order or too long).
    pub(crate) fn read_sysfs(sys_root: &Path) -> Result<NumaDistances> {
        let dir = sys_root.join("devices/system/node");
        let online_path = dir.join("online");
        let online = read_sysfs_text(&online_path).map_err(|e| bad_file(&online_path, &e))?;
        let nodes = parse_node_list(&online)
            .map_err(|why| Error::invalid(format!("{}: {why}", online_path.display())))?;
        let mut rows = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let path = dir.join(format!("node{node}/distance"));
            let text = read_sysfs_text(&path).map_err(|e| bad_file(&path, &e))?;
            let row = text
                .split_ascii_whitespace()
                .map(str::parse::<u32>)
                .collect::<Result<Vec<u32>, _>>()
                .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
            rows.push(row);
        }
        NumaDistances::new(nodes, rows)
    }

    /// The nodes the table covers.
    #[cfg(test)]
    pub(crate) fn nodes(&self) -> &[u32] {
        &self.nodes
    }

    /// The distance from `from` to `to`, if the table has both.
    pub(crate) fn distance(&self, from: u32, to: u32) -> Option<u32> {
        let row = self.row(from)?;
        let j = self.index(to)?;
        row.get(j).copied()
    }

    /// [`Topology::tier`] for two different nodes both in the table.
    fn remote_rank(&self, from: u32, device: u32) -> Option<u8> {
        let i = self.index(from)?;
        let d = self.distance(from, device)?;
        let mut classes: Vec<u32> = self
            .row(from)?
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, &d)| d)
            .collect();
        classes.sort_unstable();
        classes.dedup();
        let rank = classes.binary_search(&d).ok()?;
        Some(u8::try_from(rank.saturating_add(1)).unwrap_or(u8::MAX))
    }

    fn index(&self, node: u32) -> Option<usize> {
        self.nodes.iter().position(|&n| n == node)
    }

    fn row(&self, node: u32) -> Option<&[u32]> {
        let n = self.nodes.len();
        let start = self.index(node)?.checked_mul(n)?;
        self.matrix.get(start..start.checked_add(n)?)
    }
}

/// The longest sysfs file we read: a distance row for 1024 nodes is about
/// 4 KiB (the kernel's own cap on an attribute is a page).
const SYSFS_MAX_BYTES: u64 = 64 * 1024;

/// A small sysfs text file, trimmed; over [`SYSFS_MAX_BYTES`] or not UTF-8
/// is `InvalidData`. Reading fails with the attribute's own errno where the
/// kernel refuses (`EINVAL` from a down interface's `speed`).
pub(crate) fn read_sysfs_text(path: &Path) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(SYSFS_MAX_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > SYSFS_MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "longer than a sysfs attribute can be",
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))?;
    Ok(text.trim_ascii().to_owned())
}

fn bad_file(path: &Path, e: &std::io::Error) -> Error {
    Error::invalid(format!("{}: {e}", path.display()))
}

/// A kernel node list (`%*pbl`: `0`, `0-3`, `0,2-3`), strictly increasing,
/// at most [`NumaDistances::MAX_NODES`] ids.
fn parse_node_list(text: &str) -> std::result::Result<Vec<u32>, String> {
    let mut nodes: Vec<u32> = Vec::new();
    for part in text.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (part, part),
        };
        let lo: u32 = lo.parse().map_err(|e| format!("{part:?}: {e}"))?;
        let hi: u32 = hi.parse().map_err(|e| format!("{part:?}: {e}"))?;
        if hi < lo || nodes.last().is_some_and(|&last| lo <= last) {
            return Err(format!("{part:?} is out of order"));
        }
        // Both bounds are u32, so the count fits in u64; checked against the
        // cap before a single id is pushed.
        let count = u64::from(hi) - u64::from(lo) + 1;
        let total = (nodes.len() as u64).saturating_add(count);
        if total > NumaDistances::MAX_NODES as u64 {
            return Err(format!("more than {} nodes", NumaDistances::MAX_NODES));
        }
        nodes.extend(lo..=hi);
    }
    Ok(nodes)
}

/// Pins the calling thread to `cpu`. Returns false, after a warning, when the
/// OS refuses (the CPU is outside this process's affinity mask, say): the
/// thread then keeps running unpinned, slower but correct.
pub(crate) fn pin_current_thread(cpu: usize) -> bool {
    // core_affinity indexes a fixed-size cpu_set_t and panics beyond it.
    let limit = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    if cpu >= limit {
        tracing::warn!(cpu, limit, "cannot pin thread: core id beyond CPU_SETSIZE");
        return false;
    }
    let pinned = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    if !pinned {
        tracing::warn!(cpu, "OS refused to pin thread to core; it runs unpinned");
    }
    pinned
}

/// The NUMA nodes hwloc reports, each restricted to `allowed` (hwloc's own
/// allowed set when `None`); nodes left without CPUs (memory-only nodes such
/// as CXL or HBM, or nodes outside our affinity mask) are dropped.
fn from_hwloc(allowed: Option<&[usize]>) -> Result<Topology, String> {
    let topology =
        hwlocality::Topology::new().map_err(|e| format!("hwloc topology init failed: {e}"))?;
    let hwloc_allowed: Vec<usize> = topology
        .allowed_cpuset()
        .iter_set()
        .map(usize::from)
        .collect();
    let allowed = allowed.unwrap_or(&hwloc_allowed);
    let mut nodes = Vec::new();
    for obj in topology.objects_with_type(ObjectType::NUMANode) {
        let Some(os_index) = obj.os_index() else {
            continue;
        };
        let os_index = u32::try_from(os_index)
            .map_err(|_| format!("NUMA node index {os_index} out of range"))?;
        let Some(cpuset) = obj.cpuset() else {
            continue;
        };
        if cpuset.weight().is_none() {
            return Err(format!("NUMA node {os_index} has an infinite cpuset"));
        }
        let cpus: Vec<usize> = cpuset
            .iter_set()
            .map(usize::from)
            .filter(|cpu| allowed.contains(cpu))
            .collect();
        if !cpus.is_empty() {
            nodes.push(NumaNode { os_index, cpus });
        }
    }
    nodes.sort_by_key(|n| n.os_index);
    let topology = Topology::from_nodes(nodes);
    // If hwloc and the affinity mask disagree (a CPU we may run on that no
    // node claims), trust the mask: losing a CPU would be worse than losing
    // the NUMA split.
    let covered = topology.cpus();
    if covered.is_empty()
        || allowed
            .iter()
            .any(|cpu| covered.binary_search(cpu).is_err())
    {
        return Err(format!(
            "hwloc NUMA nodes cover {covered:?}, not every allowed CPU {allowed:?}"
        ));
    }
    Ok(topology)
}

/// CPUs to assume when neither the affinity mask nor hwloc is available.
fn fallback_cpus() -> Vec<usize> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

/// A throwaway sysfs tree for tests of the readers (here and in
/// `transport::rails::device`); removed on drop.
#[cfg(test)]
pub(crate) mod fake_sysfs {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A temp directory standing in for `/sys`.
    pub(crate) struct FakeSysfs {
        root: PathBuf,
    }

    impl FakeSysfs {
        pub(crate) fn new() -> FakeSysfs {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let root = std::env::temp_dir().join(format!(
                "tent-fake-sysfs-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&root).expect("create fake sysfs root");
            FakeSysfs { root }
        }

        pub(crate) fn root(&self) -> &Path {
            &self.root
        }

        /// Writes `contents` at `rel` (parents created).
        pub(crate) fn write(&self, rel: &str, contents: impl AsRef<[u8]>) {
            let path = self.root.join(rel);
            std::fs::create_dir_all(path.parent().expect("a file under the root"))
                .expect("create fake sysfs dir");
            std::fs::write(path, contents).expect("write fake sysfs file");
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake_sysfs::FakeSysfs;
    use super::*;

    fn two_nodes() -> Topology {
        Topology::from_nodes(vec![
            NumaNode {
                os_index: 0,
                cpus: vec![0, 1, 2, 3],
            },
            NumaNode {
                os_index: 1,
                cpus: vec![7, 4, 5, 6],
            },
        ])
    }

    #[test]
    fn from_nodes_sorts_cpus_and_answers_queries() {
        let t = two_nodes();
        assert_eq!(t.nodes()[1].cpus, vec![4, 5, 6, 7]);
        assert_eq!(t.cpus(), (0..8).collect::<Vec<_>>());
        assert_eq!(t.node_of_cpu(2), Some(0));
        assert_eq!(t.node_of_cpu(6), Some(1));
        assert_eq!(t.node_of_cpu(8), None);
    }

    fn nodes(n: u32) -> Vec<NumaNode> {
        (0..n)
            .map(|i| NumaNode {
                os_index: i,
                cpus: vec![i as usize],
            })
            .collect()
    }

    /// Two sockets of two sub-NUMA clusters each: 12 within a socket, 20
    /// across.
    fn two_sockets() -> Topology {
        let d = NumaDistances::new(
            vec![0, 1, 2, 3],
            vec![
                vec![10, 12, 20, 20],
                vec![12, 10, 20, 20],
                vec![20, 20, 10, 12],
                vec![20, 20, 12, 10],
            ],
        )
        .unwrap();
        Topology::from_nodes_with_distances(nodes(4), d)
    }

    #[test]
    fn tier_is_zero_for_the_same_or_an_unknown_node() {
        let t = two_sockets();
        assert_eq!(t.tier(Some(2), Some(2)), 0);
        assert_eq!(t.tier(None, Some(2)), 0);
        assert_eq!(t.tier(Some(2), None), 0);
        assert_eq!(t.tier(None, None), 0);
    }

    #[test]
    fn tier_ranks_the_distinct_remote_distances() {
        let t = two_sockets();
        assert_eq!(t.tier(Some(0), Some(1)), 1);
        assert_eq!(t.tier(Some(0), Some(2)), 2);
        assert_eq!(t.tier(Some(0), Some(3)), 2);
        assert_eq!(t.tier(Some(3), Some(2)), 1);
        assert_eq!(t.tier(Some(3), Some(0)), 2);

        // A distance shared by several nodes is one class: the next class
        // is the next tier, however many nodes the first one holds.
        let d = NumaDistances::new(
            vec![0, 1, 2, 3],
            vec![
                vec![10, 12, 12, 20],
                vec![12, 10, 12, 20],
                vec![12, 12, 10, 20],
                vec![20, 20, 20, 10],
            ],
        )
        .unwrap();
        let t = Topology::from_nodes_with_distances(nodes(4), d);
        assert_eq!(t.tier(Some(0), Some(2)), 1);
        assert_eq!(t.tier(Some(0), Some(3)), 2);
        assert_eq!(t.tier(Some(3), Some(0)), 1);

        // Ranks are per `from` row: an asymmetric table ranks each side on
        // its own distances.
        let d = NumaDistances::new(
            vec![0, 1, 2],
            vec![vec![10, 30, 20], vec![15, 10, 40], vec![20, 40, 10]],
        )
        .unwrap();
        let t = Topology::from_nodes_with_distances(nodes(3), d);
        assert_eq!(t.tier(Some(0), Some(2)), 1);
        assert_eq!(t.tier(Some(0), Some(1)), 2);
        assert_eq!(t.tier(Some(1), Some(0)), 1);
        assert_eq!(t.tier(Some(1), Some(2)), 2);
    }

    #[test]
    fn tier_without_a_usable_distance_is_one() {
        // No table at all.
        let t = Topology::from_nodes(nodes(2));
        assert_eq!(t.tier(Some(0), Some(1)), 1);
        assert_eq!(t.tier(Some(0), Some(7)), 1);
        // A table that does not name one of the nodes.
        let t = two_sockets();
        assert_eq!(t.tier(Some(0), Some(9)), 1);
        assert_eq!(t.tier(Some(9), Some(0)), 1);
    }

    #[test]
    fn tier_saturates_past_255_distance_classes() {
        let n = 300u32;
        let rows = (0..n)
            .map(|i| (0..n).map(|j| 10 + i.abs_diff(j)).collect())
            .collect();
        let d = NumaDistances::new((0..n).collect(), rows).unwrap();
        let t = Topology::from_nodes_with_distances(nodes(1), d);
        assert_eq!(t.tier(Some(0), Some(1)), 1);
        assert_eq!(t.tier(Some(0), Some(255)), 255);
        assert_eq!(t.tier(Some(0), Some(299)), 255);
        assert_eq!(t.distances().unwrap().distance(0, 299), Some(309));
    }

    #[test]
    fn distance_table_rejects_malformed_input() {
        let kind = |r: Result<NumaDistances>| r.unwrap_err().kind();
        let inv = crate::ErrorKind::InvalidArgument;
        assert_eq!(kind(NumaDistances::new(vec![], vec![])), inv);
        assert_eq!(
            kind(NumaDistances::new(
                vec![0, 0],
                vec![vec![10, 20], vec![20, 10]]
            )),
            inv
        );
        assert_eq!(
            kind(NumaDistances::new(vec![0, 1], vec![vec![10, 20]])),
            inv
        );
        assert_eq!(
            kind(NumaDistances::new(vec![0, 1], vec![vec![10, 20], vec![20]])),
            inv
        );
        let n = NumaDistances::MAX_NODES as u32 + 1;
        assert_eq!(
            kind(NumaDistances::new(
                (0..n).collect(),
                vec![vec![]; n as usize]
            )),
            inv
        );
        let msg = NumaDistances::new(vec![3, 5, 3], vec![vec![10; 3]; 3])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("node 3 appears twice"), "{msg}");
    }

    #[test]
    fn distances_read_from_sysfs_follow_the_online_list() {
        let sys = FakeSysfs::new();
        // Sparse ids: row position k is the k-th online node, not node k.
        sys.write("devices/system/node/online", "0,2-3\n");
        sys.write("devices/system/node/node0/distance", "10 21 31\n");
        sys.write("devices/system/node/node2/distance", "21 10 21\n");
        sys.write("devices/system/node/node3/distance", "31 21 10\n");
        let d = NumaDistances::read_sysfs(sys.root()).unwrap();
        assert_eq!(d.nodes(), &[0, 2, 3]);
        assert_eq!(d.distance(0, 3), Some(31));
        assert_eq!(d.distance(2, 0), Some(21));
        assert_eq!(d.distance(1, 0), None);
        let t = Topology::from_nodes_with_distances(nodes(1), d);
        assert_eq!(t.tier(Some(0), Some(2)), 1);
        assert_eq!(t.tier(Some(0), Some(3)), 2);
        assert_eq!(t.tier(Some(2), Some(3)), 1);
    }

    #[test]
    fn malformed_sysfs_distances_are_no_table_and_no_panic() {
        const ONLINE: &str = "devices/system/node/online";
        const ROW0: &str = "devices/system/node/node0/distance";
        const ROW1: &str = "devices/system/node/node1/distance";
        let long = format!("20 10{}", " ".repeat(70 * 1024));
        /// (path under the root, contents) of each file a case writes.
        type Files<'a> = Vec<(&'a str, &'a [u8])>;
        let cases: Vec<(&str, Files)> = vec![
            ("nothing there", vec![]),
            ("empty online list", vec![(ONLINE, b"")]),
            ("reversed range", vec![(ONLINE, b"1-0")]),
            ("repeated node", vec![(ONLINE, b"0,0")]),
            ("out of order", vec![(ONLINE, b"1,0")]),
            ("negative id", vec![(ONLINE, b"-1")]),
            ("id beyond u32", vec![(ONLINE, b"0-99999999999")]),
            ("four billion nodes", vec![(ONLINE, b"0-4294967295")]),
            ("stride syntax", vec![(ONLINE, b"0-3:2/4")]),
            ("row missing", vec![(ONLINE, b"0-1"), (ROW0, b"10 20")]),
            (
                "row too short",
                vec![(ONLINE, b"0-1"), (ROW0, b"10 20"), (ROW1, b"20")],
            ),
            (
                "empty row",
                vec![(ONLINE, b"0-1"), (ROW0, b""), (ROW1, b"20 10")],
            ),
            (
                "negative distance",
                vec![(ONLINE, b"0-1"), (ROW0, b"10 -20"), (ROW1, b"20 10")],
            ),
            (
                "distance beyond u32",
                vec![
                    (ONLINE, b"0-1"),
                    (ROW0, b"10 18446744073709551616"),
                    (ROW1, b"20 10"),
                ],
            ),
            (
                "not UTF-8",
                vec![(ONLINE, b"0-1"), (ROW0, b"10 \xff\xfe"), (ROW1, b"20 10")],
            ),
            (
                "over-long file",
                vec![(ONLINE, b"0-1"), (ROW0, b"10 20"), (ROW1, long.as_bytes())],
            ),
        ];
        for (what, files) in cases {
            let sys = FakeSysfs::new();
            for (rel, contents) in files {
                sys.write(rel, contents);
            }
            assert!(
                NumaDistances::read_sysfs(sys.root()).is_err(),
                "{what}: accepted"
            );
            let t = Topology::from_nodes(nodes(2)).with_sysfs_distances(sys.root());
            assert_eq!(t.distances(), None, "{what}");
            assert_eq!(t.tier(Some(0), Some(1)), 1, "{what}");
        }
        // The same tree, well formed, is read.
        let sys = FakeSysfs::new();
        sys.write(ONLINE, "0-1\n");
        sys.write(ROW0, "10 20\n");
        sys.write(ROW1, "20 10\n");
        let t = Topology::from_nodes(nodes(2)).with_sysfs_distances(sys.root());
        assert_eq!(t.distances().and_then(|d| d.distance(1, 0)), Some(20));
    }

    #[test]
    fn worker_node_comes_from_the_pinned_core() {
        let t = two_nodes();
        assert_eq!(t.worker_node(Some(5)), Some(1));
        assert_eq!(t.worker_node(Some(0)), Some(0));
        assert_eq!(t.worker_node(None), None);
        assert_eq!(t.worker_node(Some(99)), None);
        // The fallback topology's node 0 is a guess: no worker is placed.
        let guess = Topology {
            nodes_known: false,
            ..two_nodes()
        };
        assert_eq!(guess.worker_node(Some(5)), None);
        assert_eq!(guess.node_of_cpu(5), Some(1));
    }

    #[test]
    fn placement_spreads_across_nodes_from_the_end() {
        let t = two_nodes();
        assert_eq!(t.place_workers(0, &[]).unwrap(), Vec::<usize>::new());
        assert_eq!(t.place_workers(1, &[]).unwrap(), vec![3]);
        assert_eq!(t.place_workers(2, &[]).unwrap(), vec![3, 7]);
        assert_eq!(t.place_workers(4, &[]).unwrap(), vec![3, 7, 2, 6]);
        assert_eq!(
            t.place_workers(8, &[]).unwrap(),
            vec![3, 7, 2, 6, 1, 5, 0, 4]
        );
    }

    #[test]
    fn placement_near_the_nics_uses_their_nodes_only() {
        let t = Topology::from_nodes(vec![
            NumaNode {
                os_index: 0,
                cpus: vec![0, 1, 2, 3],
            },
            NumaNode {
                os_index: 1,
                cpus: vec![4, 5, 6, 7],
            },
        ]);
        assert_eq!(t.place_workers_near(3, &[], &[1]).unwrap(), vec![7, 6, 5]);
        // A node the topology does not have: the plain spread.
        assert_eq!(
            t.place_workers_near(2, &[], &[9]).unwrap(),
            t.place_workers(2, &[]).unwrap()
        );
        // Explicit cores win.
        assert_eq!(t.place_workers_near(1, &[2], &[1]).unwrap(), vec![2]);
    }

    #[test]
    fn placement_wraps_when_workers_outnumber_cores() {
        let t = two_nodes();
        let p = t.place_workers(10, &[]).unwrap();
        assert_eq!(p, vec![3, 7, 2, 6, 1, 5, 0, 4, 3, 7]);

        // Uneven nodes wrap independently; empty nodes are skipped.
        let t = Topology::from_nodes(vec![
            NumaNode {
                os_index: 0,
                cpus: vec![0],
            },
            NumaNode {
                os_index: 1,
                cpus: vec![],
            },
            NumaNode {
                os_index: 2,
                cpus: vec![8, 9, 10],
            },
        ]);
        assert_eq!(t.place_workers(5, &[]).unwrap(), vec![0, 10, 0, 9, 0]);
    }

    #[test]
    fn explicit_cores_are_used_round_robin() {
        let t = two_nodes();
        assert_eq!(t.place_workers(3, &[5]).unwrap(), vec![5, 5, 5]);
        assert_eq!(t.place_workers(5, &[1, 6]).unwrap(), vec![1, 6, 1, 6, 1]);
        assert_eq!(t.place_workers(1, &[1, 6, 0]).unwrap(), vec![1]);
    }

    #[test]
    fn explicit_core_outside_the_allowed_set_is_an_error() {
        let t = two_nodes();
        // Even an entry no worker would use is checked.
        match t.place_workers(1, &[1, 9]) {
            Err(TopologyError::CoreNotAllowed { core, allowed }) => {
                assert_eq!(core, 9);
                assert_eq!(allowed, (0..8).collect::<Vec<_>>());
            }
            other => panic!("{other:?}"),
        }
        let msg = t.place_workers(1, &[42]).unwrap_err().to_string();
        assert!(msg.contains("worker core 42"), "{msg}");
    }

    #[test]
    fn empty_topology_cannot_place_workers() {
        let t = Topology::from_nodes(Vec::new());
        assert!(matches!(
            t.place_workers(1, &[]),
            Err(TopologyError::NoCpus { count: 1 })
        ));
        assert_eq!(t.place_workers(0, &[]).unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn detect_finds_the_cpus_this_process_may_use() {
        let t = Topology::detect();
        assert!(!t.nodes().is_empty());
        assert!(t.nodes().iter().all(|n| !n.cpus.is_empty()));
        let mut ids: Vec<usize> = core_affinity::get_core_ids()
            .expect("affinity mask readable")
            .into_iter()
            .map(|c| c.id)
            .collect();
        ids.sort_unstable();
        assert_eq!(t.cpus(), ids);
        for &cpu in &ids {
            assert!(t.node_of_cpu(cpu).is_some());
        }
        let placed = t.place_workers(3, &[]).unwrap();
        assert!(placed.iter().all(|c| ids.contains(c)));
        // Where the kernel lists NUMA nodes, the table covers every node
        // hwloc reported (it may hold more: nodes without allowed CPUs).
        if t.nodes_known && Path::new("/sys/devices/system/node/online").exists() {
            let d = t.distances().expect("the kernel's distance table parses");
            for node in t.nodes() {
                assert!(d.nodes().contains(&node.os_index), "{d:?}");
                assert_eq!(t.tier(Some(node.os_index), Some(node.os_index)), 0);
            }
        }
    }

    #[test]
    fn detect_ignores_the_calling_threads_pinning() {
        let all = Topology::detect().cpus();
        let first = all[0];
        let seen = std::thread::spawn(move || {
            assert!(pin_current_thread(first));
            Topology::detect().cpus()
        })
        .join()
        .unwrap();
        assert_eq!(
            seen, all,
            "a pinned caller still sees every CPU the process may use"
        );
    }

    #[test]
    fn pinning_to_an_allowed_core_succeeds_and_to_a_bogus_one_fails() {
        let cpus = Topology::detect().cpus();
        let last = *cpus.last().unwrap();
        // A fresh thread, so the test harness thread keeps its affinity.
        let (ok, bogus, huge) = std::thread::spawn(move || {
            let ok = pin_current_thread(last);
            let after: Vec<usize> = core_affinity::get_core_ids()
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.id)
                .collect();
            assert_eq!(after, vec![last]);
            (ok, pin_current_thread(1000), pin_current_thread(1 << 20))
        })
        .join()
        .unwrap();
        assert!(ok);
        assert!(!bogus || cpus.contains(&1000));
        assert!(!huge);
    }
}
