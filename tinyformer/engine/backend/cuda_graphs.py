"""CUDA graphs on CuPy: ``GraphCapture`` captures callables on a stream of its own and replays them."""

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
        """The kernel launches in ``graph`` (its DOT description's kernel nodes), or None."""
        try:
            return graph.debug_dot_str().count("KERNEL")
        except Exception:
            return None
