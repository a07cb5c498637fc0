// Package prefixmeshv1 holds the generated Go for the prefixmesh.v1 gRPC API: NodeCache (the node
// agent's prefix cache, one RPC per local.PrefixCache method plus GetSummary and Stats) and the
// router's and pin store's services as they are added. The .proto files beside this one are the
// source of truth; regenerate with scripts/genproto.sh (pinned protoc plugins) and let CI's
// scripts/checkproto.sh confirm the committed code matches. Only this file is written by hand.
package prefixmeshv1
