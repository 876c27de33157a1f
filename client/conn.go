package client

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// conn is one generation of a client's sessions: a metadata ring that said
// OpHello and an IO ring attached to it. Recovery replaces the FS's conn
// with a new one (a new generation); handles are valid only in the
// generation that opened them.
type conn struct {
	gen      uint64
	meta     *ring.Client
	data     *ring.Client
	session  uint64
	token    [proto.TokenSize]byte
	version  uint32
	features uint64
	chunk    int // largest payload of one read or write request
}

// errBadCompletion is the cause of an EIO a client returns for a
// completion it cannot trust: a result larger than the request could
// carry, a body that does not decode, an offset that is not the one asked.
var errBadCompletion = errors.New("the service answered with a completion that does not fit the request")

// badCompletion is the EIO for a completion that fails validation.
func badCompletion(op uint8, why string) error {
	return fmt.Errorf("%w (%v: opcode %#x: %s)", syscall.EIO, errBadCompletion, op, why)
}

// hello negotiates the protocol with the metadata service.
func hello(ctx context.Context, meta *ring.Client) (proto.HelloResp, error) {
	req := proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: proto.FeatureReopen | proto.FeatureLeases | proto.FeatureCaps | proto.FeatureRecalls | proto.FeatureOpenCap | proto.FeatureDirOpen | proto.FeatureLinks | proto.FeatureRecordCuts}
	out := make([]byte, proto.HelloRespSize)
	comp, err := call(ctx, meta, proto.OpHello, 0, 0, 0, req.Append(nil), out)
	if err != nil {
		if errors.Is(err, proto.ErrVersion) {
			lo, hi := proto.SplitVersionRange(comp.Aux)
			return proto.HelloResp{}, fmt.Errorf("%w: the metadata service speaks protocol versions %d to %d, this client %d to %d",
				err, lo, hi, proto.MinVersion, proto.MaxVersion)
		}
		return proto.HelloResp{}, err
	}
	r, derr := proto.DecodeHelloResp(out[:comp.Result])
	if derr != nil || r.Version < proto.MinVersion || r.Version > proto.MaxVersion || r.Session == 0 ||
		r.Features&^req.Features != 0 {
		return proto.HelloResp{}, badCompletion(proto.OpHello, fmt.Sprintf("hello answer %+v", r))
	}
	return r, nil
}

// attachRetry bounds how long attach tries again while io cannot reach
// the metadata service.
const attachRetry = 10 * time.Second

// attach binds data to the metadata session of c. EAGAIN (io could not
// reach the metadata service to check the session, as while the two
// services are starting) is tried again for up to attachRetry, or until
// ctx is done.
func attach(ctx context.Context, data *ring.Client, c *conn) error {
	req := proto.AttachReq{Version: c.version, Session: c.session, Token: c.token}
	comp, err := call(ctx, data, proto.OpAttach, 0, 0, 0, req.Append(nil), nil)
	give := time.After(attachRetry)
	for wait := 10 * time.Millisecond; errors.Is(err, syscall.EAGAIN); wait = min(2*wait, 250*time.Millisecond) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (the IO service could not reach the metadata service to check this session: %v)", err, ctx.Err())
		case <-give:
			return fmt.Errorf("%w (the IO service could not reach the metadata service to check this session for %v)", err, attachRetry)
		case <-time.After(wait):
		}
		comp, err = call(ctx, data, proto.OpAttach, 0, 0, 0, req.Append(nil), nil)
	}
	if err != nil {
		if errors.Is(err, proto.ErrVersion) {
			lo, hi := proto.SplitVersionRange(comp.Aux)
			return fmt.Errorf("%w: the IO service speaks protocol versions %d to %d, this client negotiated %d",
				err, lo, hi, c.version)
		}
		return err
	}
	return nil
}

// call runs one request on c. in is the request body; out receives the
// response body (the buffer is sized for the larger of the two), and an
// empty out means the request answers none. It returns the completion; a
// negative result becomes a syscall.Errno error, a result larger than out
// is EIO (the service answered something the request cannot carry), so
// out[:Result] is always valid.
func call(ctx context.Context, c *ring.Client, op uint8, arg uint32, handle, offset uint64, in, out []byte) (ring.Completion, error) {
	// A sync waits for a device flush: a long call (ring.Call.Long).
	// A recall wait is a long poll: a lazy call (ring.Call.Lazy).
	rc := ring.Call{Op: op, Arg: arg, Handle: handle, Offset: offset, Long: op == proto.OpSync || op == proto.OpSyncMeta || op == proto.OpSyncFS,
		Lazy: op == proto.OpRecallWait}
	n := max(len(in), len(out))
	if n > 0 {
		b, err := c.Alloc(ctx, n)
		if err != nil {
			return ring.Completion{}, transportErr(err)
		}
		defer b.Release()
		b.CopyFrom(in)
		rc.Buf = b
		comp, err := c.Do(ctx, &rc)
		if err != nil {
			return comp, transportErr(err)
		}
		if comp.Result < 0 {
			return comp, resultErr(comp)
		}
		if comp.Result > int64(len(out)) {
			return comp, badCompletion(op, fmt.Sprintf("result %d for a response of at most %d bytes", comp.Result, len(out)))
		}
		b.CopyTo(out[:comp.Result])
		return comp, nil
	}
	comp, err := c.Do(ctx, &rc)
	if err != nil {
		return comp, transportErr(err)
	}
	if comp.Result < 0 {
		return comp, resultErr(comp)
	}
	if comp.Result != 0 {
		return comp, badCompletion(op, fmt.Sprintf("result %d for a request without a buffer", comp.Result))
	}
	return comp, nil
}

// resultErr is the error of a negative result: an errno, or a
// *followError for a path that met a symbolic link.
func resultErr(comp ring.Completion) error {
	if comp.Result == -int64(proto.ErrFollow) {
		return &followError{aux: comp.Aux}
	}
	return syscall.Errno(-comp.Result)
}

// followError is the metadata service's answer for a path that met a
// symbolic link the call follows (proto.ErrFollow): aux says where
// (proto.SplitFollowAux). FS.follow rewrites the path and asks again.
type followError struct{ aux uint64 }

// Error describes it; a caller sees it only from a service that answers
// it where no path was sent.
func (e *followError) Error() string {
	return fmt.Sprintf("the path met a symbolic link (aux %#x)", e.aux)
}

// transportErr maps a ring failure to an errno: the service went away (EIO,
// as a dead NFS server gives) or the request cannot be carried.
func transportErr(err error) error {
	switch {
	case errors.Is(err, ring.ErrTooLarge):
		return fmt.Errorf("%w (%v)", syscall.E2BIG, err)
	case errors.Is(err, ring.ErrClosed):
		return fmt.Errorf("%w (%v)", syscall.EBADF, err)
	case errors.Is(err, ring.ErrForeignBuffer):
		return fmt.Errorf("%w (a buffer of a session that has ended: allocate a new one: %v)", syscall.EINVAL, err)
	default:
		return &sessionError{err: err}
	}
}

// sessionError is a ring that stopped under a call: the service is gone
// (or tore the session down). It reads as EIO; the FS recovers from it.
type sessionError struct{ err error }

func (e *sessionError) Error() string { return fmt.Sprintf("%v (%v)", syscall.EIO, e.err) }
func (e *sessionError) Unwrap() []error {
	return []error{syscall.EIO, e.err}
}

// lostSession reports whether err says the ring of the call is gone.
func lostSession(err error) bool {
	var se *sessionError
	return errors.As(err, &se)
}
