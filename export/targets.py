"""The oldest iOS/iPadOS each Core ML file runs on, said once. A leaf (it imports nothing of ours) so the writers
(export/coreml.py) and the format table (export/formats.py) both read it: export's lines, encoder.json (each
artifact's deployment_target), the report's model card and the --help of --deployment-target and --coreml-format
all come from here."""

ML_PROGRAM_TARGET = "iOS16"  # the .mlpackage's default --deployment-target
ML_PROGRAM_REACH = "every iPad from 2017 on"  # what that release runs on (the 5th-generation iPad and every later one)
ML_PROGRAM_TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18")
# The .mlmodel is for iPads that cannot run an ML Program. coremltools treats the target as a ceiling and writes the
# lowest spec version the ops need: iOS13 for the convnets, iOS14 for a ViT (its slices squeeze an axis,
# sliceStatic's squeezeMasks). Each artifact's record says the version written (SPEC_TARGETS).
NEURALNETWORK_TARGET = "iOS14"
SPEC_TARGETS = {4: "iOS13", 5: "iOS14"}  # NeuralNetwork specificationVersion -> the oldest OS that runs it


def ipados(target: str) -> str:
    """'iOS16' -> 'iPadOS 16+': Core ML names its targets for iOS, and iPadOS carries the same version numbers."""
    return f"iPadOS {target.removeprefix('iOS')}+"
