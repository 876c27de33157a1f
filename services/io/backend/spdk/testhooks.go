//go:build spdk

package spdk

// createRaw makes a blob the way a foreign SPDK program or a bug would:
// with a weir.id of id, or without one if id is 0, and without the index
// knowing. For tests of Strays only.
func (be *Backend) createRaw(id uint64) error {
	var err error
	be.r.run(func() { _, err = be.newBlob(id) })
	return err
}
