"""The TensorFlow adapter: capture, ir, rewrite, runtime, measure, emulate."""
