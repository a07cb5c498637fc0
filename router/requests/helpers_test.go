package requests

import (
	"sync"

	"github.com/prefixmesh/prefixmesh/routing"
)

const simModel = "prefixmesh-sim"

// nodeList is a NodeSource the test can change.
type nodeList struct {
	mu    sync.Mutex // guards nodes
	nodes []NodeTarget
}

func (l *nodeList) Nodes() []NodeTarget {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nodes
}

func (l *nodeList) set(nodes []NodeTarget) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nodes = nodes
}

func target(id, url string) NodeTarget {
	return NodeTarget{Info: routing.NodeInfo{ID: id, Alive: true, Model: simModel, BlockSize: 16}, EngineURL: url}
}
