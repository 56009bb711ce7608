"""mmrl: reinforcement-learning fine-tuning of Qwen-VL models on images and videos."""

__version__ = "0.1.0"
