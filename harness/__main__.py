from harness import memdefrag

memdefrag()
