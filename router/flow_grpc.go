package router

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// admitFlow asks flow control to let a Route through, its class and tenant read from the call's
// metadata as every door reads them from its headers (requests.FlowRequest; lower case, as gRPC
// carries them). A request
// it does not admit is answered as gRPC clients expect: ResourceExhausted when shed, with the
// reason in the message and retry-after and x-prefixmesh-dropped-reason trailers; Unavailable
// when no node serves the model (the decision's own answer when it has no candidate).
func (s *Server) admitFlow(ctx context.Context, model string) (func(), error) {
	md, _ := metadata.FromIncomingContext(ctx)
	release, err := s.flow.Admit(ctx, requests.FlowRequest(model, func(k string) string { return first(md, k) }))
	if err == nil {
		return release, nil
	}
	var se *flow.ShedError
	switch {
	case errors.As(err, &se):
		_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", flow.RetryAfterSeconds,
			strings.ToLower(flow.HeaderDroppedReason), string(se.Reason)))
		return nil, status.Errorf(codes.ResourceExhausted, "route: %s: %v", se.Reason, se)
	case errors.Is(err, flow.ErrNoNodes):
		_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", flow.RetryAfterSeconds))
		return nil, status.Errorf(codes.Unavailable, "route: no eligible node for model %q", model)
	}
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, status.Errorf(codes.Internal, "route: flow control: %v", err)
}

// first is md's first value for key ("" when none); metadata keys are lower case.
func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
