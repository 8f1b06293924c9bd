"""CUDA graphs on CuPy: ``GraphCapture`` captures callables on a stream of its own and replays them;
``graph_nodes`` counts a captured graph's nodes by type through the CUDA driver."""

import collections
import ctypes

from . import devices
from .capture import CaptureUnavailable, capturing
from .devices import is_gpu_available


class GraphCapture:
    """Captures callables into CUDA graphs and replays them, on one stream of its own, every graph's
    allocations drawn from one private memory pool (graphs are never replayed concurrently, so
    they may share it); work outside ``capture`` uses CuPy's default pool.

    Work inside ``on_stream()`` runs on that stream without being captured (the warm-up of a new
    shape: kernels compile and load, persistent buffers come from the default pool). ``begin``
    orders the stream's next work after the current stream's; ``end`` waits for the stream.
    """

    def __init__(self):
        if devices.cupy is None or not is_gpu_available():
            raise CaptureUnavailable("CUDA graphs need CuPy and a GPU")
        if not hasattr(devices.cupy.cuda.Stream, "begin_capture"):
            raise CaptureUnavailable(f"this CuPy ({devices.cupy.__version__}) cannot capture CUDA graphs")
        self.stream = devices.cupy.cuda.Stream(non_blocking=True)
        self.pool = devices.cupy.cuda.MemoryPool()

    def begin(self):
        self.stream.wait_event(devices.cupy.cuda.get_current_stream().record())

    def end(self):
        self.stream.synchronize()

    def on_stream(self):
        return self.stream

    def capture(self, fn):
        """A graph of ``fn``'s device work (``fn`` runs, its kernels do not); raises
        ``CaptureUnavailable`` naming the reason when the capture fails."""
        graph, error = None, None
        with devices.cupy.cuda.using_allocator(self.pool.malloc), self.stream, capturing():
            self.stream.begin_capture()
            try:
                fn()
            except Exception as caught:  # end the capture in any case, then report
                error = caught
            try:
                graph = self.stream.end_capture()
            except Exception as caught:
                error = error or caught
        if error is not None:
            raise CaptureUnavailable(f"capturing the step failed: {type(error).__name__}: "
                                     f"{str(error).splitlines()[0] if str(error) else ''}") from error
        graph.upload(self.stream)
        return graph

    @staticmethod
    def adopt(array):
        """``array`` as memory of the captured step: as it is (it lives on the device)."""
        return array

    def replay(self, graph):
        graph.launch(self.stream)

    def pool_bytes(self):
        """Bytes the private pool holds for the graphs."""
        return int(self.pool.total_bytes())

    @staticmethod
    def kernel_nodes(graph):
        """The kernel launches in ``graph`` (its kernel nodes, child graphs' included), or None."""
        try:
            return graph_nodes(graph.graph)["kernel"]
        except Exception:
            return None


#: CUgraphNodeType (cuda.h) -> the name ``graph_nodes`` counts it under
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 8: "semaphore_signal", 9: "semaphore_wait", 10: "mem_alloc", 11: "mem_free",
              12: "batch_mem_op", 13: "conditional"}
CHILD_GRAPH = 4


class Driver:
    """The three graph queries of the CUDA driver API (libcuda) ``graph_nodes`` needs: a ``CUgraph``
    is the ``cudaGraph_t`` CuPy's ``Graph.graph`` holds, whatever the runtime's version."""

    def __init__(self, library=None):
        self.lib = library or ctypes.CDLL("libcuda.so.1")
        self.lib.cuGraphGetNodes.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                             ctypes.POINTER(ctypes.c_size_t)]
        self.lib.cuGraphNodeGetType.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        self.lib.cuGraphChildGraphNodeGetGraph.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]

    def _check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    def nodes(self, graph):
        count = ctypes.c_size_t(0)
        self._check(self.lib.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
        nodes = (ctypes.c_void_p * count.value)()
        self._check(self.lib.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "cuGraphGetNodes")
        return list(nodes[:count.value])

    def node_type(self, node):
        kind = ctypes.c_int(-1)
        self._check(self.lib.cuGraphNodeGetType(node, ctypes.byref(kind)), "cuGraphNodeGetType")
        return kind.value

    def child_graph(self, node):
        graph = ctypes.c_void_p()
        self._check(self.lib.cuGraphChildGraphNodeGetGraph(node, ctypes.byref(graph)), "cuGraphChildGraphNodeGetGraph")
        return graph.value


def graph_nodes(graph, driver=None):
    """The nodes of the CUDA graph ``graph`` (a ``CUgraph`` handle) by type (``NODE_TYPES``' names; a
    type the table lacks as ``type <n>``), the nodes of its child graphs counted in place of the
    child-graph nodes that hold them: a ``collections.Counter``."""
    driver = driver or Driver()
    counts, pending = collections.Counter(), [graph]
    while pending:
        for node in driver.nodes(pending.pop()):
            kind = driver.node_type(node)
            if kind == CHILD_GRAPH:
                pending.append(driver.child_graph(node))
            else:
                counts[NODE_TYPES.get(kind, f"type {kind}")] += 1
    return counts
