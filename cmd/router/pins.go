package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster/pins"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const pinsUsage = `usage: prefixmesh-router pins [--addr host:port] [--json] [--timeout d] [--tls-ca f [--tls-cert f --tls-key f]] <command> [flags]

The connection flags may also follow the command ("pins list --json").

Administers adapter pins through any router's Pins gRPC service (writes are forwarded to the
Raft leader). Commands:
  list            [--linearizable]
  members         (Raft servers, leader, and each server's last contact with the leader)
  put-adapter     --id N --name S [--base-model S] [--revision S] [--if-version V]
  delete-adapter  --id N [--if-version V]
  pin             --adapter N --nodes a,b,… [--if-version V]
  unpin           --adapter N [--if-version V]
  pin-prefix      --adapter N (--tokens 1,2,… | --text S) --nodes a,b,… [--if-version V]
  unpin-prefix    --adapter N (--tokens 1,2,… | --text S | --hash HEX) [--if-version V]
  watch           [--events N]   (the table, then changes; N > 0 stops after N events)
--if-version makes a write a compare-and-set (0: must not exist). Exit status: 0 ok, 1 the
call failed, 2 usage.
`

// runPins is the "pins" subcommand. The connection flags (--addr, --json, --timeout, --tls-*)
// may come before the command or among its own flags: "pins list --json" and "pins --json list"
// are the same call.
func runPins(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pins", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("addr", "127.0.0.1:7080", "a router's gRPC address (serve --grpc-listen)")
	asJSON := fs.Bool("json", false, "print JSON (one object per line for watch)")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of each call (not of watch)")
	ca := fs.String("tls-ca", "", "CA bundle to verify the router with (enables TLS)")
	cert := fs.String("tls-cert", "", "client certificate for mTLS")
	key := fs.String("tls-key", "", "client key for mTLS")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 || fs.Arg(0) == "help" {
		if errors.Is(err, flag.ErrHelp) || (err == nil && fs.NArg() > 0) {
			fmt.Fprint(stdout, pinsUsage)
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "router pins: %v\n", err)
		}
		fmt.Fprint(stderr, pinsUsage)
		return 2
	}
	cmd := fs.Arg(0)
	f := newCmdFlags(cmd)
	// The command's flag set also takes the connection flags, bound to the same variables.
	fs.VisitAll(func(g *flag.Flag) { f.fs.Var(g.Value, g.Name, g.Usage) })
	if err := f.fs.Parse(fs.Args()[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, pinsUsage)
			return 0
		}
		fmt.Fprintf(stderr, "router pins %s: %v\n%s", cmd, err, pinsUsage)
		return 2
	}
	if f.fs.NArg() > 0 {
		fmt.Fprintf(stderr, "router pins %s: unexpected argument %q\n%s", cmd, f.fs.Arg(0), pinsUsage)
		return 2
	}
	creds, err := pinsCreds(*ca, *cert, *key)
	if err != nil {
		fmt.Fprintf(stderr, "router pins: %v\n", err)
		return 2
	}
	cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(stderr, "router pins: connect %s: %v\n", *addr, err)
		return 2
	}
	defer cc.Close()
	p := &pinsCLI{client: pb.NewPinsClient(cc), json: *asJSON, timeout: *timeout, stdout: stdout, stderr: stderr,
		dial: func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		}}
	return p.run(ctx, cmd, f)
}

func pinsCreds(ca, cert, key string) (credentials.TransportCredentials, error) {
	if ca == "" {
		if cert != "" || key != "" {
			return nil, errors.New("--tls-cert and --tls-key need --tls-ca")
		}
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("read --tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca %s holds no PEM certificates", ca)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != "" || key != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return credentials.NewTLS(cfg), nil
}

type pinsCLI struct {
	client         pb.PinsClient
	dial           func(addr string) (*grpc.ClientConn, error) // another member (members)
	json           bool
	timeout        time.Duration
	stdout, stderr io.Writer
}

// cmdFlags are the flags of the write and list commands (each uses a subset).
type cmdFlags struct {
	fs                                       *flag.FlagSet
	id, adapter, events                      *uint64
	name, baseModel, revision, nodes, tokens *string
	text, hash, ifVersion                    *string
	linearizable                             *bool
}

func newCmdFlags(name string) *cmdFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &cmdFlags{
		fs: fs, id: fs.Uint64("id", 0, ""), adapter: fs.Uint64("adapter", 0, ""), events: fs.Uint64("events", 0, ""),
		name: fs.String("name", "", ""), baseModel: fs.String("base-model", "", ""), revision: fs.String("revision", "", ""),
		nodes: fs.String("nodes", "", ""), tokens: fs.String("tokens", "", ""), text: fs.String("text", "", ""),
		hash: fs.String("hash", "", ""), ifVersion: fs.String("if-version", "", ""), linearizable: fs.Bool("linearizable", false, ""),
	}
}

func (f *cmdFlags) version() (*uint64, error) {
	if *f.ifVersion == "" {
		return nil, nil
	}
	v, err := strconv.ParseUint(*f.ifVersion, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("--if-version %q: not a version number", *f.ifVersion)
	}
	return &v, nil
}

func (f *cmdFlags) nodeList() []string {
	var out []string
	for _, n := range strings.Split(*f.nodes, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func (f *cmdFlags) tokenList() ([]uint32, error) {
	var out []uint32
	for _, t := range strings.Split(*f.tokens, ",") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		v, err := strconv.ParseUint(t, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--tokens: %q is not a token id", t)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}

// usageError marks errors that exit with status 2.
type usageError struct{ error }

// run runs one parsed command.
func (p *pinsCLI) run(ctx context.Context, cmd string, f *cmdFlags) int {
	var err error
	if cmd == "watch" {
		err = p.watch(ctx, *f.events)
	} else {
		cctx, cancel := context.WithTimeout(ctx, p.timeout)
		err = p.call(cctx, cmd, f)
		cancel()
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(p.stderr, "router pins %s: %v\n%s", cmd, err, pinsUsage)
		return 2
	default:
		fmt.Fprintf(p.stderr, "router pins %s: %s\n", cmd, describeRPCError(err))
		return 1
	}
}

// describeRPCError renders a gRPC error for people: the code, the message and, for a
// compare-and-set failure, the current version.
func describeRPCError(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	msg := fmt.Sprintf("%s: %s", st.Code(), st.Message())
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["current_version"] != "" {
			msg += fmt.Sprintf(" (retry with --if-version %s)", info.GetMetadata()["current_version"])
		}
	}
	return msg
}

func (p *pinsCLI) call(ctx context.Context, cmd string, f *cmdFlags) error {
	ver, err := f.version()
	if err != nil {
		return usageError{err}
	}
	need := func(cond bool, what string) error {
		if !cond {
			return usageError{errors.New(what)}
		}
		return nil
	}
	switch cmd {
	case "list":
		resp, err := p.client.List(ctx, &pb.ListPinsRequest{Linearizable: *f.linearizable})
		if err != nil {
			return err
		}
		return p.printList(resp)
	case "members":
		return p.members(ctx)
	case "put-adapter":
		if err := need(*f.id != 0 && *f.name != "", "--id and --name are required"); err != nil {
			return err
		}
		resp, err := p.client.PutAdapter(ctx, &pb.PutAdapterRequest{ExpectedVersion: ver, Adapter: &pb.Adapter{
			Id: *f.id, Name: *f.name, BaseModel: *f.baseModel, Revision: *f.revision}})
		if err != nil {
			return err
		}
		return p.done(fmt.Sprintf("adapter %d now at version %d", resp.GetAdapter().GetId(), resp.GetAdapter().GetVersion()),
			map[string]any{"adapter": adapterOf(resp.GetAdapter()), "applied_index": resp.GetAppliedIndex()})
	case "delete-adapter":
		if err := need(*f.id != 0, "--id is required"); err != nil {
			return err
		}
		resp, err := p.client.DeleteAdapter(ctx, &pb.DeleteAdapterRequest{Id: *f.id, ExpectedVersion: ver})
		if err != nil {
			return err
		}
		return p.done(fmt.Sprintf("adapter %d deleted with its pins", *f.id), map[string]any{"applied_index": resp.GetAppliedIndex()})
	case "pin":
		if err := need(*f.adapter != 0 && len(f.nodeList()) > 0, "--adapter and --nodes are required"); err != nil {
			return err
		}
		resp, err := p.client.PinAdapter(ctx, &pb.PinAdapterRequest{AdapterId: *f.adapter, Nodes: f.nodeList(), ExpectedVersion: ver})
		if err != nil {
			return err
		}
		pin := pinOf(resp.GetPin())
		return p.done(fmt.Sprintf("adapter %d pinned to %s at version %d", pin.AdapterID, strings.Join(pin.Nodes, ","), pin.Version),
			map[string]any{"pin": pin, "applied_index": resp.GetAppliedIndex()})
	case "unpin":
		if err := need(*f.adapter != 0, "--adapter is required"); err != nil {
			return err
		}
		resp, err := p.client.UnpinAdapter(ctx, &pb.UnpinAdapterRequest{AdapterId: *f.adapter, ExpectedVersion: ver})
		if err != nil {
			return err
		}
		return p.done(fmt.Sprintf("adapter %d unpinned", *f.adapter), map[string]any{"applied_index": resp.GetAppliedIndex()})
	case "pin-prefix":
		toks, err := f.tokenList()
		if err != nil {
			return usageError{err}
		}
		if err := need(*f.adapter != 0 && len(f.nodeList()) > 0 && (len(toks) > 0) != (*f.text != ""),
			"--adapter, --nodes and exactly one of --tokens and --text are required"); err != nil {
			return err
		}
		resp, err := p.client.PinPrefix(ctx, &pb.SetPrefixPinRequest{AdapterId: *f.adapter, Tokens: toks, Text: *f.text, Nodes: f.nodeList(), ExpectedVersion: ver})
		if err != nil {
			return err
		}
		pp := prefixOf(resp.GetPin())
		return p.done(fmt.Sprintf("prefix %016x (%d tokens) of adapter %d pinned to %s at version %d",
			pp.Hash, len(pp.Tokens), pp.AdapterID, strings.Join(pp.Nodes, ","), pp.Version),
			map[string]any{"prefix_pin": pp, "applied_index": resp.GetAppliedIndex()})
	case "unpin-prefix":
		toks, err := f.tokenList()
		if err != nil {
			return usageError{err}
		}
		var hash uint64
		if *f.hash != "" {
			if hash, err = strconv.ParseUint(strings.TrimPrefix(*f.hash, "0x"), 16, 64); err != nil {
				return usageError{fmt.Errorf("--hash %q: not a hex hash", *f.hash)}
			}
		}
		given := 0
		for _, b := range []bool{len(toks) > 0, *f.text != "", *f.hash != ""} {
			if b {
				given++
			}
		}
		if err := need(*f.adapter != 0 && given == 1, "--adapter and exactly one of --tokens, --text and --hash are required"); err != nil {
			return err
		}
		resp, err := p.client.UnpinPrefix(ctx, &pb.ClearPrefixPinRequest{AdapterId: *f.adapter, Tokens: toks, Text: *f.text, PrefixHash: hash, ExpectedVersion: ver})
		if err != nil {
			return err
		}
		return p.done(fmt.Sprintf("prefix of adapter %d unpinned", *f.adapter), map[string]any{"applied_index": resp.GetAppliedIndex()})
	}
	return usageError{fmt.Errorf("unknown command %q", cmd)}
}

// done prints a write's outcome: a sentence, or JSON.
func (p *pinsCLI) done(text string, obj map[string]any) error {
	if p.json {
		return json.NewEncoder(p.stdout).Encode(obj)
	}
	_, err := fmt.Fprintln(p.stdout, text)
	return err
}

// listJSON is list's --json shape (stable field names, tokens included).
type listJSON struct {
	Adapters         []pins.Adapter    `json:"adapters"`
	Pins             []pins.AdapterPin `json:"pins"`
	PrefixPins       []pins.PrefixPin  `json:"prefix_pins"`
	AppliedIndex     uint64            `json:"applied_index"`
	StalenessSeconds float64           `json:"staleness_seconds"`
	LeaderID         string            `json:"leader_id"`
	ServerID         string            `json:"server_id"`
}

func toListJSON(r *pb.ListPinsResponse) listJSON {
	out := listJSON{Adapters: []pins.Adapter{}, Pins: []pins.AdapterPin{}, PrefixPins: []pins.PrefixPin{},
		AppliedIndex: r.GetAppliedIndex(), StalenessSeconds: r.GetStalenessSeconds(), LeaderID: r.GetLeaderId(), ServerID: r.GetServerId()}
	for _, a := range r.GetAdapters() {
		out.Adapters = append(out.Adapters, adapterOf(a))
	}
	for _, p := range r.GetPins() {
		out.Pins = append(out.Pins, pinOf(p))
	}
	for _, p := range r.GetPrefixPins() {
		out.PrefixPins = append(out.PrefixPins, prefixOf(p))
	}
	return out
}

func (p *pinsCLI) printList(r *pb.ListPinsResponse) error {
	if p.json {
		return json.NewEncoder(p.stdout).Encode(toListJSON(r))
	}
	leader := r.GetLeaderId()
	if leader == "" {
		leader = "none"
	}
	fmt.Fprintf(p.stdout, "answered by %s (leader %s) at applied index %d, staleness %.3fs\n\n",
		r.GetServerId(), leader, r.GetAppliedIndex(), r.GetStalenessSeconds())
	w := tabwriter.NewWriter(p.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ADAPTER\tNAME\tBASE MODEL\tREVISION\tVERSION\tPINNED TO")
	pinned := map[uint64]*pb.AdapterPin{}
	for _, pin := range r.GetPins() {
		pinned[pin.GetAdapterId()] = pin
	}
	for _, a := range r.GetAdapters() {
		where := "any node"
		if pin, ok := pinned[a.GetId()]; ok {
			where = fmt.Sprintf("%s (v%d)", strings.Join(pin.GetNodes(), ","), pin.GetVersion())
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\n", a.GetId(), a.GetName(), dash(a.GetBaseModel()), dash(a.GetRevision()), a.GetVersion(), where)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(r.GetPrefixPins()) == 0 {
		_, err := fmt.Fprintln(p.stdout, "\nno prefix pins")
		return err
	}
	fmt.Fprintln(p.stdout)
	w = tabwriter.NewWriter(p.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ADAPTER\tPREFIX HASH\tTOKENS\tNODES\tVERSION")
	for _, pp := range r.GetPrefixPins() {
		fmt.Fprintf(w, "%d\t%016x\t%d\t%s\t%d\n", pp.GetAdapterId(), pp.GetPrefixHash(), len(pp.GetTokens()), strings.Join(pp.GetNodes(), ","), pp.GetVersion())
	}
	return w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// watch prints the table, then every change, until ctx ends or max events (if > 0) arrived.
func (p *pinsCLI) watch(ctx context.Context, max uint64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.client.Watch(ctx, &pb.WatchPinsRequest{})
	if err != nil {
		return err
	}
	for n := uint64(0); max == 0 || n < max; n++ {
		ev, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := p.printEvent(ev); err != nil {
			return err
		}
	}
	return nil
}

// watchJSON is one line of watch --json.
type watchJSON struct {
	Reset        bool         `json:"reset,omitempty"`
	State        *listJSON    `json:"state,omitempty"`
	Changes      []changeJSON `json:"changes,omitempty"`
	AppliedIndex uint64       `json:"applied_index"`
}

type changeJSON struct {
	Kind      string           `json:"kind"`
	Index     uint64           `json:"index"`
	Adapter   *pins.Adapter    `json:"adapter,omitempty"`
	Pin       *pins.AdapterPin `json:"pin,omitempty"`
	PrefixPin *pins.PrefixPin  `json:"prefix_pin,omitempty"`
}

func changeKind(k pb.PinChange_Kind) string {
	return strings.ReplaceAll(strings.ToLower(k.String()), "_", "-")
}

func (p *pinsCLI) printEvent(ev *pb.PinsWatchEvent) error {
	if p.json {
		out := watchJSON{Reset: ev.GetReset_(), AppliedIndex: ev.GetAppliedIndex()}
		if ev.GetState() != nil {
			st := toListJSON(ev.GetState())
			out.State = &st
		}
		for _, c := range ev.GetChanges() {
			cj := changeJSON{Kind: changeKind(c.GetKind()), Index: c.GetIndex()}
			if c.GetAdapter() != nil {
				a := adapterOf(c.GetAdapter())
				cj.Adapter = &a
			}
			if c.GetPin() != nil {
				pin := pinOf(c.GetPin())
				cj.Pin = &pin
			}
			if c.GetPrefixPin() != nil {
				pp := prefixOf(c.GetPrefixPin())
				cj.PrefixPin = &pp
			}
			out.Changes = append(out.Changes, cj)
		}
		return json.NewEncoder(p.stdout).Encode(out)
	}
	if ev.GetReset_() {
		st := ev.GetState()
		fmt.Fprintf(p.stdout, "table at index %d: %d adapters, %d pins, %d prefix pins\n",
			ev.GetAppliedIndex(), len(st.GetAdapters()), len(st.GetPins()), len(st.GetPrefixPins()))
	}
	for _, c := range ev.GetChanges() {
		var what string
		switch {
		case c.GetAdapter() != nil:
			what = fmt.Sprintf("adapter %d %q", c.GetAdapter().GetId(), c.GetAdapter().GetName())
		case c.GetPin() != nil:
			what = fmt.Sprintf("adapter %d nodes %s", c.GetPin().GetAdapterId(), strings.Join(c.GetPin().GetNodes(), ","))
		case c.GetPrefixPin() != nil:
			pp := c.GetPrefixPin()
			what = fmt.Sprintf("adapter %d prefix %016x (%d tokens) nodes %s", pp.GetAdapterId(), pp.GetPrefixHash(), len(pp.GetTokens()), strings.Join(pp.GetNodes(), ","))
		}
		if _, err := fmt.Fprintf(p.stdout, "index %d %s %s\n", c.GetIndex(), changeKind(c.GetKind()), what); err != nil {
			return err
		}
	}
	return nil
}

func adapterOf(a *pb.Adapter) pins.Adapter {
	return pins.Adapter{ID: a.GetId(), Name: a.GetName(), BaseModel: a.GetBaseModel(), Revision: a.GetRevision(), Version: a.GetVersion()}
}

func pinOf(p *pb.AdapterPin) pins.AdapterPin {
	return pins.AdapterPin{AdapterID: p.GetAdapterId(), Nodes: p.GetNodes(), Version: p.GetVersion()}
}

func prefixOf(p *pb.PrefixPin) pins.PrefixPin {
	return pins.PrefixPin{AdapterID: p.GetAdapterId(), Hash: p.GetPrefixHash(), Tokens: p.GetTokens(), Nodes: p.GetNodes(), Version: p.GetVersion()}
}
