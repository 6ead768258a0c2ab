"""Format code the stages call: Core ML, ONNX, the Core ML reference evaluator, parity metrics, preprocessing models."""
