"""Datasets for the examples and end-to-end tests, through TensorFlow Datasets.

`load` gives Fashion-MNIST as ``(image, label)`` pairs, prepared offline from the IDX files
of Debian's ``dataset-fashion-mnist`` by the TFDS builder `AdabatchFashionMnist`; `parse_idx`
reads one IDX file.

>>> from tf_adabatch.app import data
>>> data.__all__
['AdabatchFashionMnist', 'load', 'parse_idx']
>>> data.load.__module__
'tf_adabatch.app.data.fashion_mnist'
"""

from tf_adabatch.app.data.fashion_mnist import AdabatchFashionMnist, load, parse_idx

__all__ = ["AdabatchFashionMnist", "load", "parse_idx"]
