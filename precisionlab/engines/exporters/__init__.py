"""One module per target format of `precisionlab export`: hf (a transformers
folder), gguf (llama.cpp), ct2 (CTranslate2), onnx (onnxruntime). Each reads a
Hugging Face folder (the embedded model is first written as one by hf.py) and
returns the list of what the conversion changed."""
