package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
)

// PublisherConfig configures a Publisher the way vLLM's KVEventsConfig configures its ZMQ
// publisher (the simulated engine's --sim-kv-events flags map to it).
type PublisherConfig struct {
	// Endpoint is bound for the PUB socket, e.g. tcp://127.0.0.1:5557 (port 0 picks one).
	Endpoint string
	// Replay, when set, is bound for the ROUTER replay socket.
	Replay string
	// Topic is the first frame of every message ("" by default, as vLLM's).
	Topic string
	// Layout and Hashes choose the wire shape (both of vLLM's).
	Layout Layout
	Hashes HashFormat
	// ReplayTopicFrame puts the topic frame into replay replies (vLLM ≥ v0.26.0, PR #45177).
	ReplayTopicFrame bool
	// BufferSteps is how many batches replay keeps: 10,000, vLLM's buffer_steps.
	BufferSteps int
	// QueueLen bounds the batches waiting for the PUB socket: 100,000, vLLM's max_queue_size. A
	// full queue drops the live send (the batch stays in the replay buffer, so a subscriber sees
	// a gap and replays it).
	QueueLen int
	// Rank is stamped into each batch (data_parallel_rank).
	Rank int
	// Other publishers' habits, for tests of the subscriber: FirstSeq is the first sequence
	// number (vLLM's is 0; some emulators start at 1), ParentZero spells "no parent" as 0.
	FirstSeq   uint64
	ParentZero bool
}

// DefaultPublisherConfig returns vLLM's defaults, bound on loopback.
func DefaultPublisherConfig() PublisherConfig {
	return PublisherConfig{Endpoint: "tcp://127.0.0.1:5557", BufferSteps: 10000, QueueLen: 100000}
}

// Publisher publishes KV event batches on a ZMQ PUB socket as vLLM does: [topic, seq(8 B BE),
// payload], seq from 0 per publisher instance, and serves replay requests on a ROUTER socket
// from a buffer of the newest batches. Publish never blocks.
type Publisher struct {
	cfg    PublisherConfig
	log    *slog.Logger
	pub    zmq4.Socket
	router zmq4.Socket
	q      chan zmq4.Msg
	wg     sync.WaitGroup
	cancel context.CancelFunc

	mu    sync.Mutex // guards enc, seq and buf
	enc   *Encoder
	seq   uint64
	buf   []stored // ring of the newest BufferSteps batches
	start int      // index of the oldest in buf once full

	dropped atomic.Uint64
}

type stored struct {
	seq     uint64
	payload []byte
}

// NewPublisher binds the sockets and starts the send and replay goroutines, which run until Close.
func NewPublisher(ctx context.Context, cfg PublisherConfig, logger *slog.Logger) (*Publisher, error) {
	if cfg.BufferSteps <= 0 || cfg.QueueLen <= 0 {
		return nil, fmt.Errorf("%w: publisher buffer %d and queue %d must be positive", ErrConfig, cfg.BufferSteps, cfg.QueueLen)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{cfg: cfg, log: logger, cancel: cancel, enc: NewEncoder(cfg.Layout, cfg.Hashes),
		q: make(chan zmq4.Msg, cfg.QueueLen), seq: cfg.FirstSeq}
	p.enc.ParentZero = cfg.ParentZero
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen(zmqEndpoint(cfg.Endpoint)); err != nil {
		cancel()
		return nil, fmt.Errorf("kv events publisher: bind %s: %w", cfg.Endpoint, err)
	}
	if cfg.Replay != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("prefixmesh-replay")))
		if err := p.router.Listen(zmqEndpoint(cfg.Replay)); err != nil {
			_ = p.pub.Close()
			cancel()
			return nil, fmt.Errorf("kv events publisher: bind replay %s: %w", cfg.Replay, err)
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serveReplay(ctx) }()
	}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.send(ctx) }()
	return p, nil
}

// Addr is the bound PUB address (tcp://host:port), useful with port 0.
func (p *Publisher) Addr() string { return tcpAddr(p.pub.Addr()) }

// ReplayAddr is the bound replay address, or "".
func (p *Publisher) ReplayAddr() string {
	if p.router == nil {
		return ""
	}
	return tcpAddr(p.router.Addr())
}

func tcpAddr(a net.Addr) string {
	if a == nil {
		return ""
	}
	return "tcp://" + a.String()
}

// Dropped is the number of batches not sent live because the queue was full.
func (p *Publisher) Dropped() uint64 { return p.dropped.Load() }

// Seq is the sequence number the next batch will get.
func (p *Publisher) Seq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Publish encodes events as one batch with the next sequence number, keeps it for replay and
// queues it for the PUB socket. It never blocks; an empty batch is not sent (as vLLM's scheduler
// sends nothing for a step without events).
func (p *Publisher) Publish(ts float64, events []Event) {
	if len(events) == 0 {
		return
	}
	p.mu.Lock()
	payload := append([]byte(nil), p.enc.Encode(ts, events, p.cfg.Rank)...)
	seq := p.seq
	p.seq++
	s := stored{seq: seq, payload: payload}
	if len(p.buf) < p.cfg.BufferSteps {
		p.buf = append(p.buf, s)
	} else {
		p.buf[p.start] = s
		p.start = (p.start + 1) % len(p.buf)
	}
	var seq8 [8]byte
	putSeq(seq8[:], seq)
	msg := zmq4.NewMsgFrom([]byte(p.cfg.Topic), seq8[:], payload)
	select {
	case p.q <- msg:
	default:
		p.dropped.Add(1)
	}
	p.mu.Unlock()
}

func (p *Publisher) send(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-p.q:
			if err := p.pub.SendMulti(msg); err != nil && ctx.Err() == nil {
				p.log.Warn("kv events publish", "err", err)
			}
		}
	}
}

// serveReplay answers [identity, "", seq8] with every buffered batch from seq8, then the end
// marker; any other request gets no answer, as vLLM's _service_replay.
func (p *Publisher) serveReplay(ctx context.Context) {
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			p.log.Warn("invalid replay request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		from, _ := DecodeSeq(msg.Frames[2])
		p.mu.Lock()
		var out []stored
		for i := range p.buf {
			s := p.buf[(p.start+i)%len(p.buf)]
			if s.seq >= from {
				out = append(out, s)
			}
		}
		p.mu.Unlock()
		for _, s := range out {
			var seq8 [8]byte
			putSeq(seq8[:], s.seq)
			if err := p.router.SendMulti(p.reply(id, seq8[:], s.payload)); err != nil {
				// The requester left before the end (a subscriber that only wanted the first
				// batch): ordinary, not worth a warning.
				if ctx.Err() == nil {
					p.log.Debug("replay send: the requester left", "err", err)
				}
				break
			}
		}
		var end [8]byte
		putSeq(end[:], EndSeq)
		endMsg := zmq4.NewMsgFrom(id, []byte{}, end[:], []byte{})
		if p.cfg.ReplayTopicFrame { // vLLM ≥ v0.26: [identity, "", "", END_SEQ, ""]
			endMsg = zmq4.NewMsgFrom(id, []byte{}, []byte{}, end[:], []byte{})
		}
		if err := p.router.SendMulti(endMsg); err != nil && ctx.Err() == nil {
			p.log.Debug("replay send: the requester left", "err", err)
		}
	}
}

func (p *Publisher) reply(id, seq8, payload []byte) zmq4.Msg {
	if p.cfg.ReplayTopicFrame {
		return zmq4.NewMsgFrom(id, []byte{}, []byte(p.cfg.Topic), seq8, payload)
	}
	return zmq4.NewMsgFrom(id, []byte{}, seq8, payload)
}

// Close stops the goroutines and closes the sockets.
func (p *Publisher) Close() {
	p.cancel()
	_ = p.pub.Close()
	if p.router != nil {
		_ = p.router.Close()
	}
	p.wg.Wait()
}
