// Package fleetsim holds a cluster-scale simulation of the control plane:
// many hubs' etcd registries over one real etcd, with thousands of agents
// registered, their convergence, etcd's work and one hub's death measured
// (fleetsim_test.go; FLEETSIM_HUBS and FLEETSIM_AGENTS set its size).
package fleetsim
