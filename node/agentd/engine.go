package agentd

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
	"github.com/prefixmesh/prefixmesh/node/simengine"
)

// engineSide is what the engine wiring hands back to Run.
type engineSide struct {
	close   func()
	load    cluster.LoadFunc // nil: no load to gossip
	healthy func() bool      // nil: the agent is healthy whenever it serves
	addrs   []string         // extra bound addresses for the addr file ("kvevents=…")
	kvPeer  string           // where peers pull the engine's KV, when the engine says (the simulated one)
}

// startEngine brings up the node's engine side. With --engine=sim it builds the simulated
// engine over the node's tree and mounts its OpenAI API on mux ("/"; /metrics and /healthz stay
// the agent's). With --engine=external the engine is another process that calls NodeCache over
// gRPC; nothing runs here, and --engine-url is what gets advertised. With --engine=vllm|sglang
// the engine is another process whose KV events keep mirror in step (startMirror).
func startEngine(ctx context.Context, cfg *Config, tree *local.RadixTree, mirror *kvevents.CacheMirror, restored *kvevents.Checkpoint, ann *announcer, logger *slog.Logger, reg *prometheus.Registry, mux *http.ServeMux) (engineSide, error) {
	switch cfg.Engine {
	case engineExternal:
		logger.Info("external engine", "url", cfg.EngineURL)
		return engineSide{close: func() {}}, nil
	case engineVLLM, engineSGLang:
		return startMirror(ctx, cfg, mirror, restored, ann, logger, reg)
	case engineSim:
		sc := simengine.DefaultConfig()
		sc.BlockSize = cfg.BlockSize
		sc.KVBlocks = cfg.KVBlocks
		sc.Model = cfg.Model
		sc.PrefillTokensPerSec = cfg.Sim.PrefillTokensPerSec
		sc.DecodeTokensPerSec = cfg.Sim.DecodeTokensPerSec
		sc.TokenBudget = cfg.Sim.TokenBudget
		sc.MaxConcurrent = cfg.Sim.MaxConcurrent
		sc.MaxQueue = cfg.Sim.MaxQueue
		sc.Tokenizer = cfg.Sim.Tokenizer
		sc.CPUBlocks, sc.CPUChunkBlocks, sc.CPULoadTokensPerSec = cfg.Sim.CPUBlocks, cfg.Sim.CPUChunkBlocks, cfg.Sim.CPULoadTokensPerSec
		sc.EngineID = cfg.NodeID // remote_engine_id: the node's id, unique in the cluster
		sc.KVSideChannel, sc.KVSideChannelHost = cfg.Sim.KVSideChannel, cfg.Sim.KVSideChannelHost
		sc.KVLeaseDuration, sc.KVTransferTokensPerSec = cfg.Sim.KVLease, cfg.Sim.KVTransferTokensPerSec
		sc.KVLoadFailurePolicy, sc.KVRecomputeThreshold = cfg.Sim.KVLoadFailurePolicy, cfg.Sim.KVRecomputeThreshold
		sc.KVEvents.Endpoint = cfg.Sim.KVEvents
		sc.KVEvents.Replay = cfg.Sim.KVEventsReplay
		sc.KVEvents.Topic = cfg.Sim.KVEventsTopic
		sc.KVEvents.ReplayTopicFrame = cfg.Sim.KVEventsReplayTopic
		sc.KVEvents.FirstSeq, sc.KVEvents.ParentZero = cfg.Sim.KVEventsFirstSeq, cfg.Sim.KVEventsParentZero
		if cfg.Sim.KVEventsLayout == "array" {
			sc.KVEvents.Layout = kvevents.LayoutArray
		} else {
			sc.KVEvents.Layout = kvevents.LayoutMap
		}
		if cfg.Sim.KVEventsHashes == "bytes" {
			sc.KVEvents.Hashes = kvevents.HashBytes
		}
		eng, err := simengine.New(sc, tree, logger.With("component", "simengine"), reg)
		if err != nil {
			return engineSide{}, fmt.Errorf("simulated engine: %w", err)
		}
		if err := eng.Start(ctx); err != nil {
			return engineSide{}, err
		}
		mux.Handle("/", eng.Handler())
		side := engineSide{close: eng.Close, load: simLoad(eng), kvPeer: eng.KVSideChannelAddr()}
		if a := eng.KVEventsAddr(); a != "" {
			side.addrs = append(side.addrs, "kvevents="+a)
		}
		if a := eng.KVEventsReplayAddr(); a != "" {
			side.addrs = append(side.addrs, "kvevents_replay="+a)
		}
		return side, nil
	default:
		return engineSide{}, fmt.Errorf("unknown engine %q", cfg.Engine)
	}
}

// resolveModel learns the served model from the engine's /v1/models when --model was not given,
// waiting for the engine to come up; ctx (the agent's, so SIGTERM ends the wait) bounds it.
func resolveModel(ctx context.Context, cfg *Config, logger *slog.Logger) error {
	if !mirrored(cfg.Engine) || cfg.Model != "" {
		return nil
	}
	log := logger.With("component", "kvevents")
	m, err := engineModel(ctx, cfg.EngineURL, log)
	if err != nil {
		return err
	}
	if len(m) > maxModelName {
		return fmt.Errorf("engine model %q: longer than %d bytes", m, maxModelName)
	}
	cfg.Model = m
	log.Info("engine model", "model", m)
	return nil
}

// startMirror follows a real engine (its model already resolved, see resolveModel): it
// subscribes to its KV events (one subscription
// per data-parallel rank) and probes its health, load and process start time. The agent is
// healthy while the engine is; a changed start time drops the mirror (a restart the event stream
// may not show). The follower's restarts and completeness go to ann.
func startMirror(ctx context.Context, cfg *Config, mirror *kvevents.CacheMirror, restored *kvevents.Checkpoint, ann *announcer, logger *slog.Logger, reg *prometheus.Registry) (engineSide, error) {
	log := logger.With("component", "kvevents")
	kc := cfg.kvEventsConfig()
	kc.OnRestart, kc.OnComplete = ann.restarted, ann.completeChanged
	kc.Restore = restored
	f, err := kvevents.NewFollower(kc, mirror, log, reg)
	if err != nil {
		return engineSide{}, err
	}
	ann.coldFn = f.Cold // before Start: the hooks and ann's goroutine read it
	probe := newEngineProbe(cfg.EngineURL, log, f.EngineRestarted)
	if restored != nil {
		probe.started = restored.EngineStart // another start time at the first probe: a restart meanwhile
	}
	var ckpt *checkpointer
	if cfg.StateDir != "" {
		if ckpt, err = startCheckpointer(ctx, *cfg, mirror, probe.startTime, log, reg); err != nil {
			return engineSide{}, err
		}
	}
	f.Start(ctx)
	probe.start(ctx)
	log.Info("mirroring the engine's KV events", "engine", cfg.Engine, "url", cfg.EngineURL,
		"kv_events", cfg.kvEventsConfig().Endpoint, "listen", cfg.KVEventsListen != "", "replay", cfg.KVEventsReplay, "dp_size", cfg.DPSize)
	return engineSide{
		close: func() {
			f.Close()
			probe.wait()
			if ckpt != nil {
				ckpt.close()
			}
		},
		load:    probe.load,
		healthy: probe.healthy,
	}, nil
}

// maxModelName bounds a model name learnt from the engine: it travels in gossip metadata.
const maxModelName = 255
