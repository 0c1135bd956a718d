// gfd.Engine (engine.hpp): options in, streams resolved, the block-list calls; cache sets in
// cache_set.cpp. Calls that may block or take long (creation, shutdown, planning, gathering) run
// with the GIL released.
#include "engine.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "cache_set.hpp"
#include "ext.hpp"
#include "transfer.hpp"

namespace gfd::python {
namespace {

// The engines not closed yet, for close_all_engines. Touched with the GIL held only; never
// destroyed (it outlives the interpreter's last objects).
std::vector<PyEngine*>& live_engines() {
  static auto* v = new std::vector<PyEngine*>();
  return *v;
}

// torch's current stream of `device`, when torch is loaded and has used CUDA (before, no work
// can have been queued on any other stream). torch is never imported here.
std::optional<std::uintptr_t> torch_current_stream(int device) {
  static PyObject* const torch_name = PyUnicode_InternFromString("torch");
  PyObject* torch = PyImport_GetModule(torch_name);
  if (torch == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  const py::object t = py::reinterpret_steal<py::object>(torch);
  const py::object cuda = py::getattr(t, "cuda", py::none());
  if (cuda.is_none() || !cuda.attr("is_initialized")().cast<bool>()) return std::nullopt;
  // torch's raw getter where it has one: the same handle without a Stream object made (about 7 us
  // of a 4096-block call on an H200 host).
  const py::object raw = py::getattr(t.attr("_C"), "_cuda_getCurrentRawStream", py::none());
  if (!raw.is_none()) return raw(device).cast<std::uintptr_t>();
  return cuda.attr("current_stream")(device).attr("cuda_stream").cast<std::uintptr_t>();
}

}  // namespace

PyEngine::PyEngine(py::handle device, const py::dict& options, bool from_env) {
  if (device.is_none() && !from_env) bad_type("Engine: device: expected an int, got NoneType");
  EngineOptions o = from_env ? EngineOptions::from_env() : EngineOptions{};
  if (!device.is_none())
    o.device = static_cast<int>(int_arg(device, "Engine: device", 0, INT32_MAX));
  o = options_from(o, options);
  {
    py::gil_scoped_release nogil;
    KeepCurrentDevice keep;
    engine_ = std::make_shared<Engine>(o);
  }
  ordinal_ = o.device;
  live_engines().push_back(this);
}

PyEngine::PyEngine(std::shared_ptr<Engine> engine, int ordinal, bool emulated,
                   cudaStream_t default_stream, std::shared_ptr<void> device)
    : engine_(std::move(engine)),
      ordinal_(ordinal),
      emulated_(emulated),
      default_stream_(default_stream),
      testing_device_(std::move(device)) {
  live_engines().push_back(this);
}

PyEngine::~PyEngine() {
  auto& v = live_engines();
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
  }
}

std::shared_ptr<Engine> PyEngine::engine() const {
  if (!engine_) throw Error(ErrorCode::kShutdown, "Engine: the engine is closed");
  return engine_;
}

void PyEngine::close() {
  if (!engine_) return;
  {
    std::shared_ptr<Engine> e = std::move(engine_);
    py::gil_scoped_release nogil;
    e.reset();  // waits for the engine's transfers (unless a call in flight still holds it)
  }
  // What dropped handles of its transfers kept is let go now, not at the next submission: the
  // runtime's memory they held may be freed (unmapped) once the engine is closed.
  prune_orphans();
}

cudaStream_t PyEngine::stream_of(py::handle stream, const std::string& fn) const {
  const std::string name = fn + ": stream";
  auto handle = [&](py::handle v) {
    return reinterpret_cast<cudaStream_t>(
        static_cast<std::uintptr_t>(uint_arg(v, name, UINTPTR_MAX)));
  };
  if (stream.is_none()) {
    if (emulated_) return default_stream_;
    const std::optional<std::uintptr_t> s = torch_current_stream(ordinal_);
    return s ? reinterpret_cast<cudaStream_t>(*s) : default_stream_;
  }
  if (PyBool_Check(stream.ptr()) || PyFloat_Check(stream.ptr()))
    bad_type(name + ": expected a CUDA stream, got " + type_name(stream));
  if (PyLong_Check(stream.ptr()) || integer_like(stream)) return handle(stream);
  py::object value;
  try {
    const py::object proto = py::getattr(stream, "__cuda_stream__", py::none());
    if (!proto.is_none()) {
      const py::object v = PyCallable_Check(proto.ptr()) ? proto() : proto;
      if (!py::isinstance<py::tuple>(v) || py::len(v) != 2)
        bad_type(name + ": __cuda_stream__ must return (version, handle)");
      value = py::tuple(v)[1];
    } else {
      value = py::getattr(stream, "cuda_stream",
                          py::none());  // torch.cuda.Stream, torch.cuda.ExternalStream
    }
  } catch (const py::error_already_set& e) {  // a foreign object's failing attribute
    bad_type(name + ": reading the stream handle of a " + type_name(stream) +
             " failed: " + e.what());
  }
  if (value.is_none())
    bad_type(name +
             ": expected None, an int handle, a torch.cuda.Stream or an object with "
             "__cuda_stream__, got " +
             type_name(stream));
  return handle(value);
}

py::object PyEngine::copy(Direction dir, py::handle src, py::handle dst, py::handle sizes,
                          py::handle stream) {
  const std::string fn = dir == Direction::kToDevice ? "copy_to_device" : "copy_to_host";
  const cudaStream_t st = stream_of(stream, fn);
  std::shared_ptr<Engine> e = engine();
  IntArray s = int_array(src, fn + ": src_ptrs", false);
  IntArray d = int_array(dst, fn + ": dst_ptrs", false);
  IntArray n = int_array(sizes, fn + ": sizes", true);
  for (const IntArray* a : {&s, &d, &n})
    if (a->ndim != 1 && !a->scalar)
      bad_argument(a->name + ": must be 1-D, got " + std::to_string(a->ndim) + " dimensions");
  if (s.rows() != d.rows())
    bad_argument(fn + ": src_ptrs has " + std::to_string(s.rows()) + " entries, dst_ptrs " +
                 std::to_string(d.rows()));
  if (!n.scalar && n.rows() != s.rows())
    bad_argument(fn + ": sizes has " + std::to_string(n.rows()) + " entries, src_ptrs " +
                 std::to_string(s.rows()));
  const std::size_t count = s.rows();
  const bool host_src = dir == Direction::kToDevice;
  // No block is larger than the address space; checked before any sum or end address is formed.
  const std::uint64_t max_block = host_address_end();
  const std::string size_limit = "a block is at most " + std::to_string(max_block) + " bytes";
  if (n.scalar) (void)n.at(0, 0, max_block, size_limit);  // checked even when no block uses it
  Transfer t;
  {
    py::gil_scoped_release nogil;
    std::vector<BlockCopy> blocks(count);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t a = s.at(i, 0, UINT64_MAX), b = d.at(i, 0, UINT64_MAX);
      const std::uint64_t c = n.at(i, 0, max_block, size_limit);
      const IntArray& host = host_src ? s : d;
      const IntArray& dev = host_src ? d : s;
      const std::uint64_t hp = host_src ? a : b, dp = host_src ? b : a;
      // The user address space: the engine takes host pointers as given, and a Python int can
      // be anything.
      check_host_range(hp, c, host.element(i, 0), i);
      if (dp > UINT64_MAX - c)
        bad_argument(dev.element(i, 0) + ": device address + " + std::to_string(c) +
                         " bytes runs past the end of the address space",
                     i);
      if (__builtin_add_overflow(total, c, &total))
        bad_argument(n.element(i, 0) + ": the sizes sum to more than 2**64 bytes", i);
      blocks[i] = {reinterpret_cast<const void*>(a), reinterpret_cast<void*>(b),
                   static_cast<std::size_t>(c)};
    }
    t = host_src ? e->copy_to_device(blocks, st) : e->copy_to_host(blocks, st);
  }
  std::vector<py::object> keep{py::reinterpret_borrow<py::object>(src),
                               py::reinterpret_borrow<py::object>(dst),
                               py::reinterpret_borrow<py::object>(sizes)};
  for (const IntArray* a : {&s, &d, &n})
    if (a->owner) keep.push_back(a->owner);
  py::object out = py::cast(std::make_unique<PyTransfer>(std::move(t), std::move(keep)));
  prune_orphans();
  return out;
}

void close_all_engines() {
  // One at a time, looked up again after each: closing one releases objects (and the GIL), and
  // other engines may go meanwhile.
  for (;;) {
    const auto& v = live_engines();
    const auto open =
        std::find_if(v.begin(), v.end(), [](const PyEngine* e) { return !e->closed(); });
    if (open == v.end()) break;
    try {
      (*open)->close();
    } catch (...) {  // NOLINT(bugprone-empty-catch): at exit, every engine is closed that can be
    }
  }
  drop_orphans();
}

py::class_<PyEngine> register_engine(py::module_& m) {
  // dynamic_attr: an engine takes attributes, as any Python object (tests wrap its calls).
  py::class_<PyEngine> c(m, "Engine", py::dynamic_attr(), R"doc(
A transfer engine bound to one GPU.

``gfd.Engine(device=0, **options)`` takes every option of gfd::EngineOptions by name (see
:data:`gfd.option_names` and the README's option table), with the defaults for the rest;
``gfd.Engine.from_env(**options)`` starts from the GFD_* environment variables instead. Sizes
take ints or strings such as ``"64M"``; ``backend`` and ``staging_writes`` take names
(``"gather"``, ``"auto"``...).

An engine owns a pinned staging ring, a pool of gather threads and its copy streams; keep one per
GPU for the life of the process. It is thread-safe. Use it as a context manager or call
:meth:`close`; engines still open at exit are closed then.)doc");
  c.def(py::init([](py::handle device, const py::kwargs& options) {
          return std::make_unique<PyEngine>(device, options, false);
        }),
        py::arg("device") = 0)
      .def_static(
          "from_env",
          [](py::handle device, const py::kwargs& options) {
            return std::make_unique<PyEngine>(device, options, true);
          },
          py::arg("device") = py::none(), R"doc(
An engine configured by the GFD_* environment variables (GFD_DEVICE included, unless ``device``
is given), then by ``options``.)doc")
      .def_property_readonly("device", &PyEngine::device,
                             "The CUDA device ordinal this engine serves.")
      .def_property_readonly("closed", &PyEngine::closed)
      .def_property_readonly("_emulated", &PyEngine::emulated)
      .def("close", &PyEngine::close, R"doc(
Waits for every submitted transfer, then frees the engine's threads, staging ring and streams.
Idempotent. Transfers submitted earlier may still be waited on afterwards.)doc")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyEngine& e, py::args) { e.close(); })
      .def("__repr__",
           [](const PyEngine& e) {
             const std::string head = "gfd.Engine(device=" + std::to_string(e.device());
             if (e.closed()) return head + ", closed)";
             return head + ", backend='" + to_string(e.engine()->options().backend) + "')";
           })
      .def(
          "options", [](const PyEngine& e) { return options_dict(e.engine()->options()); },
          "The options in force (automatic choices resolved), by name.")
      .def(
          "stats",
          [](const PyEngine& e) {
            EngineStats s;
            {
              std::shared_ptr<Engine> engine = e.engine();
              py::gil_scoped_release nogil;
              s = engine->stats();
            }
            return stats_dict(s);
          },
          R"doc(
Counters since creation (bytes, transfers, blocks, chunks, seconds spent gathering, in DMA,
waiting and planning) and what the engine got (hugepages, numa_node, gather_threads,
staging_bytes, cpus, ...): see gfd::EngineStats.)doc")
      .def(
          "copy_to_device",
          [](PyEngine& e, py::handle s, py::handle d, py::handle n, py::handle stream) {
            return e.copy(Direction::kToDevice, s, d, n, stream);
          },
          py::arg("src_ptrs"), py::arg("dst_ptrs"), py::arg("sizes"),
          py::arg("stream") = py::none(), R"doc(
Copies ``sizes[i]`` bytes from host address ``src_ptrs[i]`` (pinned or pageable) to device
address ``dst_ptrs[i]`` on this engine's GPU, for every i, ordered on ``stream``.

The arrays are integer numpy arrays, CPU tensors or lists (``sizes`` may be one int for all
blocks). Every block is validated first; a bad one raises :class:`gfd.Error` with ``.block`` set
to its index, and nothing is copied. Returns once every DMA is enqueued (the gather threads copy
meanwhile); work queued on ``stream`` afterwards sees the data. Sources must stay unchanged
until the transfer is done.)doc")
      .def(
          "copy_to_host",
          [](PyEngine& e, py::handle s, py::handle d, py::handle n, py::handle stream) {
            return e.copy(Direction::kToHost, s, d, n, stream);
          },
          py::arg("src_ptrs"), py::arg("dst_ptrs"), py::arg("sizes"),
          py::arg("stream") = py::none(), R"doc(
Copies blocks from this engine's GPU (``src_ptrs``) to host memory (``dst_ptrs``), after the
work already queued on ``stream``; the transfer is done when every byte is in host memory.
Arguments and validation as for :meth:`copy_to_device`.)doc")
      .def(
          "register_caches",
          [](PyEngine& e, py::handle host, py::handle device) {
            return register_caches(*e.engine(), e.device(), host, device);
          },
          py::arg("host"), py::arg("device"), R"doc(
Describes a runtime's caches to the engine once: ``host[i]`` (a host tensor, pinned for speed)
mirrors ``device[i]`` (a tensor on this engine's GPU), for every i; single tensors or equally
long lists (every layer's K and V, say). Each tensor's first dimension indexes blocks and the
rest of a block is contiguous; a pair has one dtype and block size.

Checked here (device, extents, pinned or not, no two tensors sharing a byte), so that
:meth:`copy_blocks` only checks block ids. The set keeps its tensors alive. Errors name the
tensor (``host[3]``, ``device[0]``).)doc")
      .def(
          "copy_blocks",
          [](PyEngine& e, py::handle caches, py::handle direction, py::handle s, py::handle d,
             py::handle stream, py::handle after_each) {
            const cudaStream_t st = e.stream_of(stream, "copy_blocks");
            py::object out = copy_blocks(*e.engine(), caches, direction, s, d, st, after_each);
            // Done transfers whose handles were dropped are let go after the submission, not
            // before: a load's first copies are not held up behind the previous batch's
            // bookkeeping.
            prune_orphans();
            return out;
          },
          py::arg("caches"), py::arg("direction"), py::arg("src_ids"), py::arg("dst_ids"),
          py::arg("stream") = py::none(), py::arg("after_each") = py::none(), R"doc(
One transfer on a registered :class:`CacheSet`: block ``src_ids[i]`` to block ``dst_ids[i]`` of
every pair, for every i. ``direction``: :attr:`Direction.TO_DEVICE` (or ``"to_device"``:
``src_ids`` index the host tensors) or :attr:`Direction.TO_HOST` (``"to_host"``). The ids are
1-D integer numpy arrays, CPU tensors or lists (int32 and int64 arrays are read in place).

Ordered on ``stream`` (default: torch's current stream); the call checks the ids (in range, no
destination id twice; a bad one raises :class:`gfd.InvalidArgument` whose ``.block`` is its
position i) and returns once every DMA is enqueued.

``caches`` may be a list of CacheSets (a model's layers, say): then one transfer per set with
the same ids, issued in order on ``stream`` in this one call, each starting after the previous
one has completed, so that the sets complete in order; ``after_each(k)`` is called once set k's
transfer is enqueued and before the next (record layer k's event on ``stream`` there: the
forward pass may wait for layer k alone). Returns the list of Transfers. Every id is checked
against every set before anything moves.)doc");
  return c;
}

}  // namespace gfd::python
