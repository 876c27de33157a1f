//go:build spdk

package spdk

/*
#include "weir_spdk.h"
*/
import "C"

// createRaw makes a blob the way a foreign SPDK program or a bug would:
// with a weir.id of id, or without one if id is 0, and without the index
// knowing. For tests of Strays only.
func (be *Backend) createRaw(id uint64) error {
	var err error
	be.r.run(func() {
		var sid uint64
		var blob *C.struct_spdk_blob
		if sid, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_create(be.bs, op) }); err != nil {
			return
		}
		if _, _, blob, err = be.r.do(func(op *C.weir_op) { C.weir_open(be.bs, C.uint64_t(sid), op) }); err != nil {
			return
		}
		if id != 0 {
			C.weir_set_u64(blob, nameID, C.uint64_t(id))
			C.weir_set_u64(blob, nameSize, 0)
		}
		_, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_sync_md(blob, op) })
		be.r.do(func(op *C.weir_op) { C.weir_close(blob, op) })
	})
	return err
}
