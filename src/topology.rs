//! The machine as the engine sees it: NUMA nodes and the CPUs this process
//! may run on, plus worker placement and core pinning.
//!
//! Detection goes through hwloc; when hwloc cannot build a topology the
//! engine still runs, as one node holding every allowed CPU. Placement and
//! everything downstream take a [`Topology`] value rather than probing the
//! machine, so tests can describe several NUMA nodes on a one-node machine.

use hwlocality::object::types::ObjectType;

/// The machine as the engine sees it: NUMA nodes with their CPUs, restricted
/// to the CPUs this process may run on. Injectable for tests through
/// [`Topology::from_nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<NumaNode>,
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
pub enum TopologyError {
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
    /// thread's allowed CPUs and logs why at debug level.
    pub fn detect() -> Topology {
        match from_hwloc(None) {
            Ok(topology) => {
                tracing::debug!(nodes = ?topology.nodes, "topology detected with hwloc");
                topology
            }
            Err(why) => {
                let cpus = core_affinity::get_core_ids()
                    .map(|ids| ids.into_iter().map(|c| c.id).collect())
                    .unwrap_or_else(fallback_cpus);
                tracing::debug!(%why, ?cpus, "hwloc topology unavailable; using one NUMA node");
                Topology::from_nodes(vec![NumaNode { os_index: 0, cpus }])
            }
        }
    }

    /// A synthetic topology, for tests and for callers that know better than
    /// hwloc. Node order is kept; each node's CPUs are sorted and
    /// de-duplicated.
    pub fn from_nodes(nodes: Vec<NumaNode>) -> Topology {
        let nodes = nodes
            .into_iter()
            .map(|mut node| {
                node.cpus.sort_unstable();
                node.cpus.dedup();
                node
            })
            .collect();
        Topology { nodes }
    }

    /// The NUMA nodes, in OS-index order when detected.
    pub fn nodes(&self) -> &[NumaNode] {
        &self.nodes
    }

    /// Every allowed CPU, sorted.
    pub fn cpus(&self) -> Vec<usize> {
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
    pub fn node_of_cpu(&self, cpu: usize) -> Option<u32> {
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
    pub fn place_workers(
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
    pub fn place_workers_near(
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

/// Pins the calling thread to `cpu`. Returns false, after a warning, when the
/// OS refuses (the CPU is outside this process's affinity mask, say): the
/// thread then keeps running unpinned, slower but correct.
pub fn pin_current_thread(cpu: usize) -> bool {
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

#[cfg(test)]
mod tests {
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
