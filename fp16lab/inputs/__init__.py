"""The input pipeline: where a training batch comes from, and what it costs.

Modules:

- :mod:`~fp16lab.inputs.settings`: :class:`InputSettings`, :class:`InputPipeline` (the one
  interface every backend returns) and the constants the backends share.
- :mod:`~fp16lab.inputs.registry`: the backends by name, :func:`make_input` (checks, then
  builds) and :func:`unavailable_reason`.
- one module per backend: :mod:`~fp16lab.inputs.synthetic`, :mod:`~fp16lab.inputs.dataloader`,
  :mod:`~fp16lab.inputs.gpu_decode`, :mod:`~fp16lab.inputs.hw_decode`,
  :mod:`~fp16lab.inputs.dali`.
- :mod:`~fp16lab.inputs.dataset`: a JPEG data set made on disk, and reading it back.
- :mod:`~fp16lab.inputs.augment`: ImageNet's augmentation on a CPU and on a GPU.
- :mod:`~fp16lab.inputs.producers`: work made on threads and handed over in order.
- :mod:`~fp16lab.inputs.feeding`: the loader's and the training step's images/s.
"""

from .augment import (IMAGENET_MEAN, IMAGENET_STD, RATIO, SCALE, TRIES, augment_pil,
                      augment_tensor, batch_generator, crop_params, crops_from_uniforms,
                      draw_crops, flip_draw, normalize, resized_crops)
from .dataset import (IMAGE_EXTENSIONS, CorruptImageError, ImageFolderInfo, load_rgb,
                      make_image_folder, read_jpeg_bytes, scan_image_folder, synthetic_photo)
from .feeding import (ProcessCpu, input_label, loader_table, make_input_train_step,
                      measure_loader, measure_training, plot_training, speedup_table,
                      summary_lines, training_label, training_table)
from .gpu_decode import (GPU_DECODE_DEPTH, GPU_DECODE_PRODUCERS, augment_batch, decode_batch,
                         decode_on_cpu, gpu_decode_pipeline, gpu_decode_unavailable)
from .hw_decode import (HW_DECODER, HwDecoder, hw_decode_pipeline, hw_decode_unavailable,
                        new_decoder)
from .producers import OrderedProducer
from .dali import dali_pipeline, dali_unavailable
from .dataloader import JpegFolder, dataloader_pipeline
from .registry import BACKENDS, REGISTRY, Backend, make_input, unavailable_reason
from .settings import (CPU_SHARE_BACKENDS, InputPipeline, InputSettings, cpu_cores, physical_cores,
                       default_workers)
from .synthetic import synthetic_pipeline

__all__ = [
    # settings and the registry
    "BACKENDS", "CPU_SHARE_BACKENDS", "REGISTRY", "Backend", "InputPipeline", "InputSettings",
    "cpu_cores", "default_workers", "make_input", "physical_cores", "unavailable_reason",
    # the backends
    "synthetic_pipeline", "JpegFolder", "dataloader_pipeline", "GPU_DECODE_DEPTH",
    "GPU_DECODE_PRODUCERS", "augment_batch", "decode_batch", "decode_on_cpu",
    "gpu_decode_pipeline", "gpu_decode_unavailable", "HW_DECODER", "HwDecoder",
    "hw_decode_pipeline", "hw_decode_unavailable", "new_decoder", "dali_pipeline",
    "dali_unavailable",
    # the data set
    "CorruptImageError", "IMAGE_EXTENSIONS", "ImageFolderInfo", "load_rgb", "make_image_folder",
    "read_jpeg_bytes", "scan_image_folder", "synthetic_photo",
    # augmentation
    "IMAGENET_MEAN", "IMAGENET_STD", "RATIO", "SCALE", "TRIES", "augment_pil", "augment_tensor",
    "batch_generator", "crop_params", "crops_from_uniforms", "draw_crops", "flip_draw",
    "normalize", "resized_crops",
    # producers and the feeding measurements
    "OrderedProducer", "ProcessCpu", "input_label", "loader_table", "make_input_train_step",
    "measure_loader", "measure_training", "plot_training", "speedup_table", "summary_lines",
    "training_label", "training_table",
]
