package sim

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// ErrBadTrace is returned, wrapped with the line, for a trace row that cannot be read.
var ErrBadTrace = errors.New("sim: bad trace row")

// Request is one trace row, expanded to tokens.
type Request struct {
	Arrival      time.Duration // since the first row, already divided by the speed factor
	Tokens       []uint32      // the prompt; shared read-only by every run of the same trace
	OutputTokens int           // tokens to decode after the first
	SessionKey   uint64        // multi-turn session, 0 when the trace has none
}

// Trace is a replayable request sequence, sorted by arrival (stable: rows sharing a timestamp
// keep file order).
type Trace struct {
	Requests []Request
}

// ReadOptions shape how a trace file becomes a Trace.
type ReadOptions struct {
	// Speed divides every inter-arrival time; 2 replays the trace twice as fast. 0 means 1.
	Speed float64
	// Limit keeps only the first Limit rows; 0 keeps all.
	Limit int
	// Seed drives the synthetic prefix structure laid over traces that have none (Azure).
	Seed uint64
	// SystemPrompts is the number of shared system prompts laid over an Azure trace; 0 disables
	// the synthetic prefix structure (every prompt is unique).
	SystemPrompts int
	// SessionShare is the probability that an Azure request continues a recent session (its
	// prompt extends that session's last prompt and answer) rather than starting a new one.
	SessionShare float64
}

// DefaultReadOptions: real time, whole trace, and for Azure a structure loosely like a chat
// service: 16 system prompts (a handful of products times a few prompt versions) and half of
// the requests being later turns of a conversation (ShareGPT conversations average ~2 turns).
func DefaultReadOptions() ReadOptions {
	return ReadOptions{Speed: 1, SystemPrompts: 16, SessionShare: 0.5}
}

// MooncakeBlockTokens is the block size of a Mooncake trace's hash_ids.
const MooncakeBlockTokens = 512

// Vocab bounds the synthetic token ids, about a real tokenizer's vocabulary: small enough to be
// realistic, large enough that two different 16-token chunks never coincide in practice.
const Vocab = 50000

// splitmix64 is Steele et al.'s SplitMix64 finaliser: a fixed, seedless mix, so expansion is
// the same on every machine and in every release.
func splitmix64(x uint64) uint64 { return local.Mix64(x + 0x9e3779b97f4a7c15) }

// appendSegment appends n tokens of segment id: token j is splitmix64(id·1e6 + j) mod Vocab, so
// equal ids give equal tokens and different ids give (almost surely) different ones.
func appendSegment(dst []uint32, id uint64, n int) []uint32 {
	for j := 0; j < n; j++ {
		dst = append(dst, uint32(splitmix64(id*1_000_000+uint64(j))%Vocab))
	}
	return dst
}

// ExpandMooncake turns hash_ids of 512-token blocks into tokens, the last block cut so that
// len(result) == inputLength. Ids beyond the input are ignored; missing ids are an error.
func ExpandMooncake(hashIDs []int64, inputLength int) ([]uint32, error) {
	if inputLength < 0 || len(hashIDs)*MooncakeBlockTokens < inputLength {
		return nil, fmt.Errorf("%w: %d hash_ids cannot cover %d tokens", ErrBadTrace, len(hashIDs), inputLength)
	}
	out := make([]uint32, 0, inputLength)
	for _, id := range hashIDs {
		if id < 0 {
			return nil, fmt.Errorf("%w: negative hash_id %d", ErrBadTrace, id)
		}
		n := min(MooncakeBlockTokens, inputLength-len(out))
		if n <= 0 {
			break
		}
		out = appendSegment(out, uint64(id), n)
	}
	return out, nil
}

type mooncakeRow struct {
	Timestamp    *float64 `json:"timestamp"` // ms since start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// ReadMooncake reads the Mooncake FAST'25 JSONL format (one request per line: timestamp in ms,
// input_length, output_length, hash_ids of 512-token prefix-chained blocks).
func ReadMooncake(r io.Reader, opt ReadOptions) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20) // a 191k-token row is ~2.5 KB; long contexts grow
	var tr Trace
	var stamps []float64
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		if opt.Limit > 0 && len(tr.Requests) >= opt.Limit {
			break
		}
		var row mooncakeRow
		if err := json.Unmarshal([]byte(text), &row); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadTrace, line, err)
		}
		if row.Timestamp == nil || row.OutputLength < 0 {
			return nil, fmt.Errorf("%w: line %d: missing timestamp or negative output_length", ErrBadTrace, line)
		}
		toks, err := ExpandMooncake(row.HashIDs, row.InputLength)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		stamps = append(stamps, *row.Timestamp)
		tr.Requests = append(tr.Requests, Request{Tokens: toks, OutputTokens: row.OutputLength})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mooncake trace: %w", err)
	}
	tr.setArrivals(stamps, float64(time.Millisecond), opt.Speed)
	return &tr, nil
}

// setArrivals converts stamps (in units of unit nanoseconds) to arrivals relative to the
// earliest, divided by speed, and sorts stably by arrival.
func (tr *Trace) setArrivals(stamps []float64, unit, speed float64) {
	if speed <= 0 {
		speed = 1
	}
	if len(stamps) == 0 {
		return
	}
	t0 := stamps[0]
	for _, s := range stamps {
		t0 = min(t0, s)
	}
	for i, s := range stamps {
		tr.Requests[i].Arrival = time.Duration((s - t0) * unit / speed)
	}
	sort.SliceStable(tr.Requests, func(i, j int) bool { return tr.Requests[i].Arrival < tr.Requests[j].Arrival })
}

// QuantizeArrivals rounds every arrival down to a multiple of q (q > 0), so requests within one
// q-long window arrive in the same instant: bursts replayed from any trace, as traces published
// with coarse timestamps, agent fan-outs and batch jobs arrive. The order of requests (and so an
// Azure trace's synthetic sessions, laid over in arrival order) does not change.
func (tr *Trace) QuantizeArrivals(q time.Duration) error {
	if q <= 0 {
		return fmt.Errorf("%w: arrival quantum %v must be positive", ErrBadTrace, q)
	}
	for i := range tr.Requests {
		tr.Requests[i].Arrival -= tr.Requests[i].Arrival % q
	}
	return nil
}

// azureLayout is the Azure trace's timestamp: 7 fractional digits, no zone (UTC).
const azureLayout = "2006-01-02 15:04:05.9999999"

// ReadAzure reads the Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens).
// It has no prefix information: with opt.SystemPrompts > 0 a seeded synthetic structure is laid
// over it (see synthAzure), otherwise every prompt is unique.
func ReadAzure(r io.Reader, opt ReadOptions) (*Trace, error) {
	cr := csv.NewReader(bufio.NewReader(r))
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	var stamps []float64
	var lens, outs []int
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadTrace, err)
		}
		if line == 1 && strings.EqualFold(strings.TrimSpace(rec[0]), "TIMESTAMP") {
			continue
		}
		if opt.Limit > 0 && len(stamps) >= opt.Limit {
			break
		}
		ts, err := time.Parse(azureLayout, strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadTrace, line, err)
		}
		in, err1 := strconv.Atoi(strings.TrimSpace(rec[1]))
		out, err2 := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err1 != nil || err2 != nil || in < 0 || out < 0 {
			return nil, fmt.Errorf("%w: line %d: bad token counts %q, %q", ErrBadTrace, line, rec[1], rec[2])
		}
		stamps = append(stamps, float64(ts.UnixNano()))
		lens = append(lens, in)
		outs = append(outs, out)
	}
	tr := &Trace{Requests: make([]Request, len(stamps))}
	synthAzure(tr.Requests, lens, outs, opt)
	tr.setArrivals(stamps, 1, opt.Speed)
	return tr, nil
}

// Segment id spaces for the synthetic Azure structure: system prompts and fresh text never
// share ids with each other (nor, by the top bits, with Mooncake block ids).
const (
	segSystem = 1 << 62
	segFresh  = 1 << 61
	// maxOpenSessions bounds how far back a later turn may reach: a chat's next turn comes
	// within minutes, and at the traces' few requests per second that is a few hundred rows.
	maxOpenSessions = 256
)

type synthSession struct {
	key     uint64
	history []uint32 // the last prompt followed by its answer
}

// synthAzure builds prompts of the given lengths with a seeded prefix structure: each new
// conversation starts with one of opt.SystemPrompts shared system prompts (Zipf-like popularity;
// prompt k is 128·(k+1) tokens, cut to the context length) followed by fresh text; with
// probability opt.SessionShare a request instead continues a random open conversation whose
// history (last prompt + answer) is shorter than its context, extending it with fresh text.
// Answers are fresh text of the row's generated length.
func synthAzure(reqs []Request, lens, outs []int, opt ReadOptions) {
	rng := rand.New(rand.NewPCG(opt.Seed, 0x5eed))
	var open []synthSession
	fresh := uint64(segFresh)
	nextSession := 0
	for i := range reqs {
		n := lens[i]
		reqs[i].OutputTokens = outs[i]
		if opt.SystemPrompts <= 0 {
			fresh++
			reqs[i].Tokens = appendSegment(make([]uint32, 0, n), fresh, n)
			continue
		}
		toks := make([]uint32, 0, n)
		s := -1
		if len(open) > 0 && rng.Float64() < opt.SessionShare {
			if c := rng.IntN(len(open)); len(open[c].history) < n {
				s = c
			}
		}
		if s >= 0 {
			toks = append(toks, open[s].history...)
		} else {
			k := zipfPick(rng, opt.SystemPrompts)
			toks = appendSegment(toks, segSystem+uint64(k), min(n, 128*(k+1)))
			nextSession++
			open = append(open, synthSession{key: uint64(nextSession)})
			if len(open) > maxOpenSessions {
				open = open[1:]
			}
			s = len(open) - 1
		}
		fresh++
		toks = appendSegment(toks, fresh, n-len(toks))
		fresh++
		open[s].history = appendSegment(append(open[s].history[:0:0], toks...), fresh, outs[i])
		reqs[i].Tokens = toks
		reqs[i].SessionKey = open[s].key
	}
}

// zipfPick draws k in [0, n) with probability proportional to 1/(k+1).
func zipfPick(rng *rand.Rand, n int) int {
	var total float64
	for k := 1; k <= n; k++ {
		total += 1 / float64(k)
	}
	x := rng.Float64() * total
	for k := 1; k <= n; k++ {
		x -= 1 / float64(k)
		if x < 0 {
			return k - 1
		}
	}
	return n - 1
}
